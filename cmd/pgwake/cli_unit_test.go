package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app:s3cret@db:5432/app?sslmode=disable": "postgres://app:xxxxx@db:5432/app?sslmode=disable",
		"postgres://app@db/app":                             "postgres://app@db/app",
		"postgres://db/app":                                 "postgres://db/app",
		"host=db user=app password=s3cret dbname=app":       "host=db user=app password=xxxxx dbname=app",
		"postgres://app:s3 cret@[bad/x":                     "postgres://xxxxx@[bad/x",
		"host=db sslpassword=s3cret sslkey=/k":              "host=db sslpassword=xxxxx sslkey=/k",
		`host=db password=s3\ cret dbname=app`:              "host=db password=xxxxx dbname=app",
		"postgres://db/app?sslpassword=s3cret":              "postgres://db/app?sslpassword=xxxxx",
	} {
		got := redactURL(in)
		require.Equal(t, want, got, in)
		require.NotContains(t, got, "s3cret")
	}
}

func TestReorderArgs(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("json", false, "")
	fs.String("schema", "", "")
	require.Equal(t, []string{"--json", "--schema", "s", "42", "-"},
		reorderArgs(fs, []string{"42", "--json", "--schema", "s", "-"}))
	require.Equal(t, []string{"--schema=s", "1", "--json"}, reorderArgs(fs, []string{"1", "--schema=s", "--", "--json"}))
}

func TestParseHandlers(t *testing.T) {
	t.Parallel()
	h, err := parseHandlers([]string{"a=exec:echo a=b", "b.c=exec:true"})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "echo a=b", "b.c": "true"}, h)
	for _, bad := range [][]string{nil, {"a"}, {"=exec:x"}, {"a=exec:"}, {"a=http://x"}, {"a=exec:x", "a=exec:y"}, {"a b=exec:x"}} {
		_, err := parseHandlers(bad)
		require.Error(t, err, "%q", bad)
	}
}

// FuzzReadBatch: any input either parses into jobs with a kind or is
// rejected with an error; it never panics.
func FuzzReadBatch(f *testing.F) {
	f.Add(`{"kind":"a","payload":{"x":1}}` + "\n" + `{"kind":"b","delay":"1s","run_after":"2030-01-01T00:00:00Z"}`)
	f.Add(`{"payload":null}`)
	f.Add("\n\n{}\n")
	f.Add(`{"kind":"a","delay":"-1s"}`)
	f.Fuzz(func(t *testing.T, in string) {
		jobs, _, err := readBatch(strings.NewReader(in), queue.NewJob{Kind: "dflt"})
		if err != nil {
			return
		}
		for _, j := range jobs {
			if j.Kind == "" {
				t.Fatalf("job without kind from %q", in)
			}
			if j.Delay < 0 {
				t.Fatalf("negative delay from %q", in)
			}
		}
	})
}
