// Package ui is pgwake's web dashboard: an http.Handler that shows every
// queue's counters, the jobs with filters and keyset pages, a job's payload,
// errors and event history, and that retries, cancels, pauses and resumes
// through the queue package's API (so each action writes its event).
//
// It is live without polling from the browser: one LISTEN per process
// (notify.Listener) on queue.EventsChannel, fed by the NOTIFY that
// transactions writing events send at commit while a watcher is registered,
// at most one per 25 ms (queue.Client.WatchEvents, migrations 0015 and
// 0017); the handler then reads the event log after its last id, once more
// 50 ms later (for the commits that shared a notification) and again while
// reads find events, and pushes events and fresh counters to every open
// page over server-sent events. A reconnecting page resumes from its
// Last-Event-ID through the event log, without gaps; one whose resume point
// is too far behind, or below events pruned since, is told to reload.
//
// Mount it under a prefix:
//
//	h, _ := ui.New(ui.Config{Client: client, Listener: listener, Prefix: "/pgwake"})
//	go h.Run(ctx)
//	mux.Handle("/pgwake/", h)
//
// It reads and writes only through queue.Client: no SQL is built from a
// request. See docs/ui.md.
package ui
