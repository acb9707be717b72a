package broker

import "context"

// SetTestHookAppendDurable sets the hook that runs in Append once a batch is
// durable in the WAL, before it is acknowledged; nil removes it.
func SetTestHookAppendDurable(f func(brokerID string)) { testHookAppendDurable = f }

// UploadNow uploads and commits what the AutoMQ-mode broker's WAL holds.
func (b *AutomqBroker) UploadNow(ctx context.Context) error { return b.uploadOnce(ctx) }
