package history

import (
	"testing"
	"time"
)

func ack(stream uint64, call, ret int64, base, epoch uint64, ids ...string) Op {
	return Op{Kind: KindAppend, Stream: stream, Call: call, Return: ret, IDs: ids, Outcome: Ok, Base: base, StreamEpoch: epoch, BrokerEpoch: 1, Broker: "b1"}
}

func read(stream uint64, call, ret int64, from uint64, owner bool, ids ...string) Op {
	return Op{Kind: KindRead, Stream: stream, Call: call, Return: ret, From: from, Max: 100, Owner: owner, ReadIDs: ids, Broker: "b1"}
}

func TestCheck(t *testing.T) {
	cases := []struct {
		name string
		ops  []Op
		want string
	}{
		{"appends then a full read", []Op{
			ack(1, 0, 10, 0, 1, "a", "b"), ack(1, 11, 20, 2, 1, "c"), read(1, 21, 30, 0, true, "a", "b", "c"),
		}, Linearizable},
		{"a read concurrent with an append may see it or not", []Op{
			ack(1, 0, 10, 0, 1, "a"), ack(1, 11, 30, 1, 1, "b"), read(1, 12, 20, 0, true, "a", "b"), read(1, 12, 20, 0, true, "a"),
		}, Linearizable},
		{"an acknowledged record missing from the owner's read", []Op{
			ack(1, 0, 10, 0, 1, "a"), ack(1, 11, 20, 1, 1, "b"), read(1, 21, 30, 0, true, "a"),
		}, NotLinearizable},
		{"a committed-only read may lag behind", []Op{
			ack(1, 0, 10, 0, 1, "a"), ack(1, 11, 20, 1, 1, "b"), read(1, 21, 30, 0, false, "a"),
		}, Linearizable},
		{"another record at an acknowledged offset", []Op{
			ack(1, 0, 10, 0, 1, "a"), read(1, 21, 30, 0, false, "x"),
		}, NotLinearizable},
		{"a gap: acknowledged past the end", []Op{
			ack(1, 0, 10, 0, 1, "a"), ack(1, 11, 20, 2, 1, "b"),
		}, NotLinearizable},
		{"an unanswered append later seen", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindAppend, Stream: 1, Call: 11, Return: 12, IDs: []string{"b"}, Outcome: Unknown},
			ack(1, 20, 25, 2, 1, "b"), read(1, 30, 40, 0, true, "a", "b", "b"),
		}, Linearizable},
		{"a refused-after-write append not seen", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindAppend, Stream: 1, Call: 11, Return: 12, IDs: []string{"b"}, Outcome: Maybe, Reason: "LEASE_INVALID"},
			read(1, 30, 40, 0, true, "a"),
		}, Linearizable},
		{"retries of a refused append: the one that took effect is found", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindAppend, Stream: 1, Call: 11, Return: 12, IDs: []string{"x"}, Outcome: Maybe, Reason: "LEASE_INVALID"},
			{Kind: KindAppend, Stream: 1, Call: 13, Return: 14, IDs: []string{"x"}, Outcome: Maybe, Reason: "LEASE_INVALID"},
			read(1, 15, 16, 0, true, "a"),
			{Kind: KindAppend, Stream: 1, Call: 17, Return: 18, IDs: []string{"x", "y"}, Outcome: Maybe, Reason: "LEASE_INVALID"},
			ack(1, 20, 21, 3, 1, "x", "y"),
			read(1, 30, 40, 0, true, "a", "x", "y", "x", "y"),
		}, Linearizable},
		{"an idempotent retry answered with the earlier attempt's offsets", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindAppend, Stream: 1, Call: 11, Return: 12, IDs: []string{"x", "y"}, Outcome: Maybe, Reason: "LEASE_INVALID"},
			read(1, 13, 14, 0, true, "a", "x", "y"),
			{Kind: KindAppend, Stream: 1, Call: 15, Return: 16, IDs: []string{"x", "y"}, Outcome: Ok, Base: 1, StreamEpoch: 1, Duplicate: true},
			ack(1, 17, 18, 3, 1, "z"),
			read(1, 30, 40, 0, true, "a", "x", "y", "z"),
		}, Linearizable},
		{"a duplicate answer for records that are not there", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindAppend, Stream: 1, Call: 15, Return: 16, IDs: []string{"x"}, Outcome: Ok, Base: 1, StreamEpoch: 1, Duplicate: true},
			read(1, 30, 40, 0, true, "a"),
		}, NotLinearizable},
		{"records nobody appended", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindAppend, Stream: 1, Call: 11, Return: 12, IDs: []string{"x"}, Outcome: Maybe, Reason: "LEASE_INVALID"},
			read(1, 30, 40, 0, true, "a", "z"),
		}, NotLinearizable},
		{"an append acknowledged under an epoch seen closed", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindStream, Stream: 1, Call: 11, Return: 12, State: "closed", Epoch: 1, EndOffset: 1},
			ack(1, 13, 20, 1, 1, "b"),
		}, NotLinearizable},
		{"the next epoch after the close", []Op{
			ack(1, 0, 10, 0, 1, "a"),
			{Kind: KindStream, Stream: 1, Call: 11, Return: 12, State: "closed", Epoch: 1, EndOffset: 1},
			ack(1, 13, 20, 1, 2, "b"),
		}, Linearizable},
		{"streams are checked apart", []Op{
			ack(1, 0, 10, 0, 1, "a"), ack(2, 0, 10, 0, 1, "x"), read(2, 11, 12, 0, true, "x"), read(1, 11, 12, 0, true, "a"),
		}, Linearizable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Check(tc.ops, 10*time.Second, "")
			if err != nil || got != tc.want {
				t.Fatalf("Check = %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestCountStaleWrites(t *testing.T) {
	ops := []Op{
		ack(1, 0, 10, 0, 1, "a"),
		{Kind: KindBroker, Broker: "b1", Call: 11, Return: 12, Epoch: 1, Fenced: true},
		ack(1, 13, 20, 1, 1, "b"), // broker epoch 1 after it was seen fenced
		{Kind: KindLease, Broker: "b1", Call: 21, Return: 22, Epoch: 1, Valid: true},
		{Kind: KindAppend, Stream: 1, Call: 30, Return: 31, Outcome: Maybe, Reason: "LEASE_INVALID"},
	}
	c := Count(ops)
	if c.StaleWrites != 1 || c.StaleLeases != 1 || c.LeaseInvalid != 1 || c.AppendsOK != 2 || c.Appends != 3 {
		t.Fatalf("Count = %+v", c)
	}
}
