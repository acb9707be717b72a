package broker

import "context"

// UploadNow uploads and commits what the AutoMQ-mode broker's WAL holds.
func (b *AutomqBroker) UploadNow(ctx context.Context) error { return b.uploadOnce(ctx) }
