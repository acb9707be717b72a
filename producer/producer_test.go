package producer_test

import (
	"errors"
	"fmt"
	"testing"

	"walden/producer"
	waldenv1 "walden/proto/walden/v1"
)

func TestFraming(t *testing.T) {
	recs := [][]byte{[]byte("a"), {}, []byte("hello")}
	for _, h := range []producer.Header{{}, {ID: 7, Sequence: 42}} {
		p := producer.Encode(h, recs)
		got, out, err := producer.Decode(p, 3)
		if err != nil || got != h || len(out) != 3 || string(out[0]) != "a" || len(out[1]) != 0 || string(out[2]) != "hello" {
			t.Fatalf("header %+v: round trip %+v %q %v", h, got, out, err)
		}
		if hh, err := producer.HeaderOf(p); err != nil || hh != h {
			t.Fatalf("header %+v: HeaderOf %+v %v", h, hh, err)
		}
		for name, c := range map[string]struct {
			p     []byte
			count uint32
		}{
			"wrong count":    {p, 2},
			"truncated":      {p[:len(p)-1], 3},
			"trailing bytes": {append(append([]byte(nil), p...), 0, 0), 3},
		} {
			if _, _, err := producer.Decode(c.p, c.count); !errors.Is(err, producer.ErrCorrupt) {
				t.Errorf("header %+v, %s: %v", h, name, err)
			}
		}
	}
	for name, p := range map[string][]byte{
		"length too big": {0, 0, 0, 9, 'x'},
		"short header":   {0xff, 0xff, 0xff, 0xff, 0, 0, 0},
		"producer id 0":  append([]byte{0xff, 0xff, 0xff, 0xff}, make([]byte, 16)...),
	} {
		if _, _, err := producer.Decode(p, 1); !errors.Is(err, producer.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestTableCheck(t *testing.T) {
	tb := producer.NewTable(nil)
	if v, _ := tb.Check(1, 5, 1); v != producer.Unknown {
		t.Fatalf("unknown producer at sequence 5: %v", v)
	}
	if v, _ := tb.Check(1, 0, 3); v != producer.Append {
		t.Fatalf("first batch: %v", v)
	}
	tb.Record(1, 0, 3, 100)
	cases := []struct {
		seq   uint64
		count uint32
		want  producer.Verdict
	}{
		{0, 3, producer.Duplicate},  // retry of the last batch
		{3, 2, producer.Append},     // next
		{0, 2, producer.OutOfOrder}, // retry with another count
		{4, 1, producer.OutOfOrder}, // gap
		{1, 1, producer.OutOfOrder}, // inside the last batch
	}
	for _, c := range cases {
		v, last := tb.Check(1, c.seq, c.count)
		if v != c.want {
			t.Errorf("sequence %d count %d: %v, want %v", c.seq, c.count, v, c.want)
		}
		if v == producer.Duplicate && (last.GetOffset() != 100 || last.GetCount() != 3) {
			t.Errorf("duplicate answers %v", last)
		}
	}
	tb.Record(1, 3, 2, 103)
	if v, _ := tb.Check(1, 0, 3); v != producer.OutOfOrder {
		t.Errorf("retry of an older batch: %v", v)
	}
	if v, last := tb.Check(1, 3, 2); v != producer.Duplicate || last.GetOffset() != 103 {
		t.Errorf("retry of the new last batch: %v %v", v, last)
	}
	// A copy of the table as the catalog hands it over says the same.
	cp := producer.NewTable(tb.States())
	if v, last := cp.Check(1, 3, 2); v != producer.Duplicate || last.GetOffset() != 103 {
		t.Errorf("copied table: %v %v", v, last)
	}
}

func TestTableForgetsTheOldestBeyondTheBound(t *testing.T) {
	tb := producer.NewTable(nil)
	for i := uint64(1); i <= producer.MaxPerStream+10; i++ {
		tb.Record(i, 0, 1, i*10)
	}
	if tb.Len() != producer.MaxPerStream {
		t.Fatalf("%d producers kept, want %d", tb.Len(), producer.MaxPerStream)
	}
	for i := uint64(1); i <= 10; i++ {
		if v, _ := tb.Check(i, 1, 1); v != producer.Unknown {
			t.Fatalf("producer %d (oldest) still known: %v", i, v)
		}
	}
	if v, _ := tb.Check(11, 1, 1); v != producer.Append {
		t.Fatalf("producer 11 forgotten: %v", v)
	}
	// The same records in another order leave the same table.
	other := producer.NewTable(nil)
	for i := uint64(producer.MaxPerStream + 10); i >= 1; i-- {
		other.Record(i, 0, 1, i*10)
	}
	if fmt.Sprint(other.States()) != fmt.Sprint(tb.States()) {
		t.Fatal("eviction depends on the order of records")
	}
}

func TestSummaryKeepsEachProducersLastBatch(t *testing.T) {
	var s producer.Summary
	add := func(stream, off uint64, count uint32, h producer.Header) {
		if err := s.Add(stream, off, count, producer.Encode(h, make([][]byte, count))); err != nil {
			t.Fatal(err)
		}
	}
	add(1, 0, 2, producer.Header{ID: 9, Sequence: 0})
	add(1, 2, 1, producer.Header{}) // not idempotent
	add(1, 3, 3, producer.Header{ID: 9, Sequence: 2})
	add(1, 6, 1, producer.Header{ID: 4, Sequence: 0})
	add(2, 0, 1, producer.Header{ID: 9, Sequence: 0})
	got := s.Streams()
	want := []*waldenv1.StreamProducers{
		{StreamId: 1, Producers: []*waldenv1.ProducerState{
			{ProducerId: 4, Sequence: 0, Count: 1, Offset: 6},
			{ProducerId: 9, Sequence: 2, Count: 3, Offset: 3},
		}},
		{StreamId: 2, Producers: []*waldenv1.ProducerState{{ProducerId: 9, Sequence: 0, Count: 1, Offset: 0}}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("summary %v\nwant %v", got, want)
	}
	if err := s.Add(3, 0, 1, []byte{0xff, 0xff, 0xff, 0xff, 1}); !errors.Is(err, producer.ErrCorrupt) {
		t.Fatalf("malformed header: %v", err)
	}
}
