package pubsub_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/migrations"
)

// A Watermill router consumes "orders.created" with a handler that writes
// an invoice in the message's claim transaction, so the invoice commits
// exactly when the message is acknowledged. The order and its message are
// published in one business transaction (an outbox without a relay).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	const schema = "example_watermill"
	if _, err := migrations.Up(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`) //nolint:errcheck // example cleanup
	if _, err := pool.Exec(ctx, `
		CREATE TABLE `+schema+`.orders (id int PRIMARY KEY);
		CREATE TABLE `+schema+`.invoices (order_id int PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	// Register the group before publishing: a group gets the messages
	// published after it registered.
	if err := sub.SubscribeInitialize("orders.created"); err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	billed := make(chan string, 1)
	router.AddConsumerHandler("billing", "orders.created", sub, func(msg *message.Message) error {
		tx, _ := pubsub.TxFromContext(msg.Context())
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+schema+`.invoices VALUES ($1::text::int)`, string(msg.Payload)); err != nil {
			return err // Nack: the insert rolls back, the message comes again
		}
		select {
		case billed <- string(msg.Payload):
		default:
		}
		return nil // Ack: the insert commits with the message's completion
	})
	go func() {
		if err := router.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	<-router.Running()

	// The order and its event commit together, or not at all.
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.orders VALUES (42)`); err != nil {
		log.Fatal(err)
	}
	if err := pub.PublishTx(ctx, tx, "orders.created", message.NewMessage(watermill.NewUUID(), []byte("42"))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	fmt.Println("billed order", <-billed)
	if err := router.Close(); err != nil {
		log.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		log.Fatal(err)
	}
	var invoices int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.invoices`).Scan(&invoices); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices:", invoices)
	// Output:
	// billed order 42
	// invoices: 1
}
