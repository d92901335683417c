package queue

import "testing"

func TestSettingChangesSession(t *testing.T) {
	for sql, want := range map[string]bool{
		`SET statement_timeout = '1s'`:  true,
		`set search_path to app`:        true,
		`  SET ROLE app_user`:           true,
		`SET SESSION AUTHORIZATION app`: true,
		`SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE`: true,
		`SET SESSION statement_timeout = 0`:                                       true,
		`RESET ALL`:                                                               true,
		`reset role`:                                                              true,
		`LISTEN jobs_done`:                                                        true,
		`SELECT 1; SET lock_timeout = 0`:                                          true,
		`/* note */ SET x.y = 1`:                                                  true,
		"-- note\nset x.y = 1":                                                    true,
		`(SET x = 1)`:                                                             true,
		`SELECT set_config('app.tenant', $1, false)`:                              true,
		`SELECT pg_catalog.set_config('app.tenant', $1, $2)`:                      true,
		`SELECT SET_CONFIG('a', 'b,c', False)`:                                    true,
		`SELECT set_config('a', 'x', true), set_config('b', 'y', false)`:          true,
		`SET LOCAL statement_timeout = '1s'`:                                      false,
		`set local role app`:                                                      false,
		`SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`:                            false,
		`SET CONSTRAINTS ALL DEFERRED`:                                            false,
		`UPDATE t SET x = 1`:                                                      false,
		`INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET x = 2`:           false,
		`WITH u AS (UPDATE t SET x = 1 RETURNING *) SELECT * FROM u`:              false,
		`SELECT set_config('app.tenant', $1, true)`:                               false,
		`SELECT set_config('app.tenant', 'a,b', TRUE)`:                            false,
		`SELECT 'SET ROLE x; RESET ALL'`:                                          false,
		`SELECT 1 -- ; SET x = 1`:                                                 false,
		`SELECT my_set_config(1)`:                                                 false,
		`SELECT offset_x FROM resets`:                                             false,
		`INSERT INTO settings (k) VALUES ('set role')`:                            false,
		``: false,
	} {
		if _, got := settingChanges(sql); got != want {
			t.Errorf("settingChanges(%q) session = %v, want %v", sql, got, want)
		}
	}
}

// The check runs on every statement a handler sends: it allocates nothing.
func TestSettingChangesAllocations(t *testing.T) {
	stmts := []string{
		`INSERT INTO effects (job_id, attempt) VALUES ($1, $2)`,
		`UPDATE t SET x = 1 WHERE id = $1; SELECT 1`,
		`SELECT SET_CONFIG('app.tenant', $1, TRUE)`,
		`Set Local statement_timeout = '1s'`,
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, s := range stmts {
			_, _ = settingChanges(s)
		}
	}); n != 0 {
		t.Errorf("%.1f allocations, want 0", n)
	}
}

func TestSettingChangesAny(t *testing.T) {
	for sql, want := range map[string]bool{
		`SET LOCAL ROLE app`:                           true,
		`set local statement_timeout = 5`:              true,
		`SELECT set_config('app.tenant', $1, true)`:    true,
		`SET ROLE app`:                                 true,
		`SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`: false,
		`SET CONSTRAINTS ALL DEFERRED`:                 false,
		`UPDATE t SET x = 1`:                           false,
		`SELECT 'set local role x'`:                    false,
	} {
		if got, _ := settingChanges(sql); got != want {
			t.Errorf("settingChanges(%q) any = %v, want %v", sql, got, want)
		}
	}
}

func BenchmarkSettingChanges(b *testing.B) {
	sql := `INSERT INTO app.orders (id, customer_id, total, status, created_at) VALUES ($1, $2, $3, 'new', now()) ON CONFLICT (id) DO UPDATE SET total = excluded.total RETURNING id`
	for b.Loop() {
		settingChanges(sql)
	}
}
