package broker

// SetTestHookAppendDurable sets the hook that runs in Append once a batch is
// durable in the WAL, before it is acknowledged; nil removes it.
func SetTestHookAppendDurable(f func(brokerID string)) { testHookAppendDurable = f }
