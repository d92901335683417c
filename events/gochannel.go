package events

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// NewGoChannel returns an in-process Watermill Pub/Sub set up for the
// stream: Publish blocks until every subscriber acknowledged the message, so
// subscribers see events in commit order and an acknowledged WAL position
// means the events were handled. With no subscriber, messages are dropped
// (and acknowledged): subscribe before running the Stream. logger may be
// nil.
func NewGoChannel(logger watermill.LoggerAdapter) *gochannel.GoChannel {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
}
