package broker_test

import (
	"errors"
	"testing"

	"walden/broker"
)

func TestRecordFraming(t *testing.T) {
	recs := [][]byte{[]byte("a"), {}, []byte("hello")}
	p := broker.EncodeRecords(recs)
	got, err := broker.DecodeRecords(p, 3)
	if err != nil || len(got) != 3 || string(got[0]) != "a" || len(got[1]) != 0 || string(got[2]) != "hello" {
		t.Fatalf("round trip %q %v", got, err)
	}
	for name, c := range map[string]struct {
		p     []byte
		count uint32
	}{
		"wrong count":    {p, 2},
		"truncated":      {p[:len(p)-1], 3},
		"trailing bytes": {append(append([]byte(nil), p...), 0, 0), 3},
		"length too big": {[]byte{0, 0, 0, 9, 'x'}, 1},
	} {
		if _, err := broker.DecodeRecords(c.p, c.count); !errors.Is(err, broker.ErrCorruptFrame) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
