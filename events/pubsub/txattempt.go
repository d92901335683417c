package pubsub

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TxAttempt is a Router middleware that runs each call of the handler in a
// savepoint of the message's transaction (TxFromContext): a call that
// returns an error rolls back what it wrote, and a statement that failed
// leaves the transaction usable for the next call. Place it inside Retry
// (added after it, so that Retry wraps it): every retry of a delivery then
// starts from the message's transaction as it was, where without it a
// failed try's writes commit with the try that succeeds, and one failed
// statement fails every later try ("current transaction is aborted").
// Each call costs two statements (SAVEPOINT, then RELEASE or ROLLBACK TO).
// A message not delivered by this package is passed through.
func TxAttempt(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		orig := msg.Context()
		tx, ok := TxFromContext(orig)
		if !ok {
			return h(msg)
		}
		sp, err := tx.Begin(orig)
		if err != nil {
			return nil, err
		}
		msg.SetContext(context.WithValue(orig, txKey{}, sp))
		defer msg.SetContext(orig)
		out, herr := h(msg)
		if herr != nil {
			_ = sp.Rollback(orig) // the try's writes go, and a failed statement with them
			return out, herr
		}
		if err := sp.Commit(orig); err != nil { // RELEASE SAVEPOINT
			return out, err
		}
		return out, nil
	}
}
