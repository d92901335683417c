package events_test

const helperEnv = "PGWAKE_TEST_EVENTS_HELPER"

func helperMain() int { return 3 }
