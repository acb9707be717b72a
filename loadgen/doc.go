// Package loadgen is the producer and the checker of walden's end-to-end
// proof: Load appends numbered records to streams through whichever broker
// owns each one (following NOT_OWNER hints and the catalog) and writes a
// ledger of every acknowledged record; Verify reads the streams back through
// the brokers' Read API and checks the ledger against them.
//
// It owns the ledger format (one JSON object per line:
// {"stream":S,"offset":O,"id":"S/N"}) and the record payload format (the
// record id, '|', then filler bytes).
//
// It must never write a ledger line for a record that was not
// acknowledged, and never run unbounded: Load stops at its duration and its
// record count.
package loadgen
