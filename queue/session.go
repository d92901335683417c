package queue

import (
	"strings"

	"github.com/pgwake/pgwake/internal/sqlident"
)

// A handler's statement can change settings pgwake's own statements run
// under: the role (SET ROLE, SET SESSION AUTHORIZATION) or a timeout
// (statement_timeout, lock_timeout), with SET, SET LOCAL, RESET or
// set_config. pgwake completes the job in the same transaction, after the
// handler (in held mode the next handlers of the batch run there too): a
// role without pgwake's grants failed the completion, so the job could
// never succeed. So after a handler that sent one through its tx and
// returned nil, pgwake restores those settings for the rest of the
// transaction (restoreSettings, transaction-local).
//
// A change without LOCAL (SET, RESET, set_config(name, value, false),
// LISTEN, SET SESSION CHARACTERISTICS) also commits with the job and would
// stay with the pooled connection, for pgwake's statements and the
// application's (a tenant id set for row-level security, a role, a
// timeout). So once that job's transaction ends its connection is closed,
// not returned to the pool. Statements through a nested transaction
// (tx.Begin) count too; changes made inside a function or through
// tx.Conn() are not seen. TestHandlerSettingsDoNotOutliveItsJob.

// restoreSettings puts back, for the rest of the transaction, the settings
// pgwake's statements depend on: the session's user, the role, and the
// timeouts' defaults. role is the one the transaction ran as before the
// handler's first statement that may have changed it (saw read it), or nil:
// then the role the connection started with (SET LOCAL role TO DEFAULT; a
// startup parameter "role" is kept, where ROLE NONE would give the login
// role, and a role a pool's AfterConnect set is not a start value, hence
// the read). TestHandlerRoleRestoredToThePoolsRole.
//
// idle is the claim's idle_in_transaction_session_timeout ("": the
// default): a handler that set a short one (SET LOCAL ... = 1) had the
// session killed between handlers, the next job blamed for it.
func restoreSettings(role *string, idle string) string {
	setRole := `SET LOCAL role TO DEFAULT`
	if role != nil {
		setRole = `SELECT pg_catalog.set_config('role', ` + sqlident.Literal(*role) + `, true)`
	}
	setIdle := `SET LOCAL idle_in_transaction_session_timeout TO DEFAULT`
	if idle != "" {
		setIdle = `SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', ` + sqlident.Literal(idle) + `, true)`
	}
	// statement_timeout first: the handler's value (1ms, say) times the
	// whole message, until the statement that puts it back.
	return `SET LOCAL statement_timeout TO DEFAULT; SET LOCAL SESSION AUTHORIZATION DEFAULT; ` + setRole + `; SET LOCAL lock_timeout TO DEFAULT; ` + setIdle
}

// currentRole reads the role a transaction runs as ("none": the session
// user's own).
const currentRole = `SELECT pg_catalog.current_setting('role')`

// mentionsRole reports whether a statement that changes settings may
// change the role (SET ROLE, set_config('role', ...), SET SESSION
// AUTHORIZATION): a false positive costs one round trip (saw).
func mentionsRole(sql string) bool {
	return containsFold(sql, "role") || containsFold(sql, "authorization")
}

// settingChanges reports whether sql may change a setting (changed: SET, SET
// LOCAL, RESET, set_config, LISTEN) and whether the change may outlive
// the transaction (session: all of those but SET LOCAL, SET TRANSACTION,
// SET CONSTRAINTS and set_config(..., true)). ASCII case-insensitive,
// statement by statement, without allocating; a false positive costs one
// statement (changed) or one new connection (session).
func settingChanges(sql string) (changed, session bool) {
	if !strings.ContainsAny(sql, "sSlLrR") {
		return false, false
	}
	for i := 0; i < len(sql); {
		stmt, next := nextStatement(sql, i)
		w, rest := firstWord(stmt)
		switch {
		case strings.EqualFold(w, "set"):
			next, _ := firstWord(rest)
			switch {
			case strings.EqualFold(next, "transaction"), strings.EqualFold(next, "constraints"):
			case strings.EqualFold(next, "local"):
				changed = true
			default:
				return true, true
			}
		case strings.EqualFold(w, "reset"), strings.EqualFold(w, "listen"):
			return true, true
		}
		i = next
	}
	called, session := setConfigCalls(sql)
	return changed || called, session
}

// nextStatement returns the statement of sql that begins at start, up to a
// semicolon outside quotes and comments, and where the next one begins.
func nextStatement(sql string, start int) (stmt string, next int) {
	for i := start; i < len(sql); i++ {
		switch sql[i] {
		case '\'', '"':
			i = skipQuoted(sql, i)
		case '-':
			if i+1 < len(sql) && sql[i+1] == '-' {
				for i < len(sql) && sql[i] != '\n' {
					i++
				}
			}
		case '/':
			if i+1 < len(sql) && sql[i+1] == '*' {
				if end := strings.Index(sql[i+2:], "*/"); end >= 0 {
					i += end + 3
				} else {
					i = len(sql)
				}
			}
		case ';':
			return sql[start:i], i + 1
		}
	}
	return sql[start:], len(sql)
}

// skipQuoted returns the index of the quote that closes the one at i (or
// the end of sql); a doubled quote is part of the text.
func skipQuoted(sql string, i int) int {
	q := sql[i]
	for i++; i < len(sql); i++ {
		if sql[i] == q {
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i
		}
	}
	return len(sql)
}

// firstWord returns s's first word, past whitespace, opening parentheses
// and comments, and what follows it.
func firstWord(s string) (word, rest string) {
	for {
		s = strings.TrimLeft(s, " \t\r\n\f(")
		switch {
		case strings.HasPrefix(s, "--"):
			if nl := strings.IndexByte(s, '\n'); nl >= 0 {
				s = s[nl+1:]
				continue
			}
			return "", ""
		case strings.HasPrefix(s, "/*"):
			if end := strings.Index(s, "*/"); end >= 0 {
				s = s[end+2:]
				continue
			}
			return "", ""
		}
		break
	}
	n := 0
	for n < len(s) && isIdent(s[n]) {
		n++
	}
	return s[:n], s[n:]
}

// setConfigCalls reports whether sql calls set_config, and whether one of
// those calls has a third argument other than a literal true.
func setConfigCalls(sql string) (called, session bool) {
	const name = "set_config"
	for u := 0; ; u++ {
		// Only where its underscore is.
		k := strings.IndexByte(sql[u:], '_')
		if k < 0 {
			return called, false
		}
		u += k
		i := u - 3
		if i < 0 || i+len(name) > len(sql) || !strings.EqualFold(sql[i:i+len(name)], name) || i > 0 && isIdent(sql[i-1]) {
			continue
		}
		j := i + len(name)
		for j < len(sql) && (sql[j] == ' ' || sql[j] == '\t' || sql[j] == '\r' || sql[j] == '\n') {
			j++
		}
		if j >= len(sql) || sql[j] != '(' {
			continue
		}
		called = true
		if n, third := callArg(sql, j, 2); n != 3 || !strings.EqualFold(strings.TrimSpace(third), "true") {
			return true, true
		}
	}
}

func isIdent(c byte) bool {
	return c|0x20 >= 'a' && c|0x20 <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '$'
}

// callArg returns how many arguments the call whose list opens at s[open]
// ('(') has, and the one at index k (from 0).
func callArg(s string, open, k int) (n int, arg string) {
	depth, start := 0, open+1
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '\'', '"':
			i = skipQuoted(s, i)
		case '(':
			depth++
		case ')', ',':
			if s[i] == ')' {
				depth--
			}
			if depth == 0 || s[i] == ',' && depth == 1 {
				if n == k {
					arg = s[start:i]
				}
				n++
				start = i + 1
			}
			if depth == 0 {
				return n, arg
			}
		}
	}
	return n + 1, arg
}
