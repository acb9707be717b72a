package fieldlimit

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

func TestCheck(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	ranges := func(n int) []*waldenv1.ObjectRange {
		out := make([]*waldenv1.ObjectRange, n)
		for i := range out {
			out[i] = &waldenv1.ObjectRange{StreamId: uint64(i + 1)}
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"a 3 MB wal.path", Check(&waldenv1.RegisterRequest{BrokerId: "b1", Wal: &waldenv1.WalLocation{Path: long(3 << 20)}}), "wal.path"},
		{"a path of 4097 bytes", Check(&waldenv1.RegisterRequest{Wal: &waldenv1.WalLocation{Path: long(MaxPath + 1)}}), "wal.path"},
		{"a 2 KiB reason", Check(&waldenv1.FailoverRequest{BrokerId: "b1", Reason: long(2048)}), "reason"},
		{"a 2 KiB S3 key", Check(&waldenv1.CommitObjectRequest{Object: &waldenv1.Object{Key: long(2048)}}), "object.key"},
		{"10001 ranges", Check(&waldenv1.CommitObjectRequest{Object: &waldenv1.Object{Ranges: ranges(MaxRepeated + 1)}}), "object.ranges"},
		{"a 2 KiB policy value", Check(&waldenv1.SetPolicyRequest{Set: map[string]string{"cooldown": long(2048)}}), `set["cooldown"]`},
		{"a 2 KiB policy key", Check(&waldenv1.SetPolicyRequest{Set: map[string]string{long(2048): "1s"}}), `set["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"...] (key)`},
		{"1001 policy keys", Check(&waldenv1.SetPolicyRequest{Set: func() map[string]string {
			m := map[string]string{}
			for i := range MaxMapEntries + 1 {
				m[strings.Repeat("k", i%50)+string(rune('a'+i%26))+strings.Repeat("z", i/26)] = "x"
			}
			return m
		}()}), "set"},
		{"a 2 KiB unset key", Check(&waldenv1.SetPolicyRequest{Unset: []string{"a", long(2048)}}), "unset[1]"},
	} {
		var v *Violation
		if !errors.As(tc.err, &v) || v.Field != tc.field {
			t.Errorf("%s: %v, want a violation of %s", tc.name, tc.err, tc.field)
		}
	}
	// At the limits: accepted.
	for _, err := range []error{
		Check(&waldenv1.RegisterRequest{BrokerId: "b1", AgentAddr: long(MaxString), Wal: &waldenv1.WalLocation{Path: long(MaxPath)}}),
		Check(&waldenv1.CommitObjectRequest{Object: &waldenv1.Object{Ranges: ranges(MaxRepeated)}}),
		Check(&waldenv1.RaftFrame{ClusterName: "c", FromId: "c1", Message: []byte(long(8 << 20))}), // bytes are not limited here
		Check(nil),
	} {
		if err != nil {
			t.Errorf("within the limits: %v", err)
		}
	}
}

// TestMillisBoundsBeforeArithmetic is finding 5 of the hardening table:
// SetMaintenance ttl_ms = 2^63-1 passed a bound that multiplied first
// (time.Duration(ms) * time.Millisecond wrapped to 1.5 s).
func TestMillisBoundsBeforeArithmetic(t *testing.T) {
	for _, tc := range []struct {
		ms      int64
		lo, hi  time.Duration
		want    time.Duration
		refused string
	}{
		{ms: 0, hi: time.Hour, want: 0},
		{ms: 1500, hi: time.Hour, want: 1500 * time.Millisecond},
		{ms: 3_600_000, hi: time.Hour, want: time.Hour},
		{ms: 3_600_001, hi: time.Hour, refused: "3600001 ms (1h0m0.001s) is more than the 1h0m0s allowed"},
		{ms: math.MaxInt64, hi: 168 * time.Hour, refused: "9223372036854775807 ms is more than the 168h0m0s allowed"},
		{ms: math.MaxInt64 / 1000, hi: 168 * time.Hour, refused: "ms is more than the 168h0m0s allowed"},
		{ms: -1, hi: time.Hour, refused: "-1 ms is less than the 0s allowed"},
		{ms: math.MinInt64, hi: time.Hour, refused: "-9223372036854775808 ms is less than the 0s allowed"},
		{ms: 50, lo: 100 * time.Millisecond, hi: time.Hour, refused: "50 ms (50ms) is less than the 100ms allowed"},
	} {
		got, err := Millis("ttl_ms", tc.ms, tc.lo, tc.hi)
		if tc.refused == "" {
			if err != nil || got != tc.want {
				t.Errorf("Millis(%d) = %v, %v; want %v", tc.ms, got, err, tc.want)
			}
			continue
		}
		var v *Violation
		if !errors.As(err, &v) || v.Field != "ttl_ms" || !strings.Contains(v.Reason, tc.refused) {
			t.Errorf("Millis(%d) = %v, %v; want a violation of ttl_ms saying %q", tc.ms, got, err, tc.refused)
		}
	}
	if n, err := Count("limit", 10, 100); n != 10 || err != nil {
		t.Errorf("Count(10) = %d, %v", n, err)
	}
	var v *Violation
	if _, err := Count("max_objects", math.MaxUint64, 100); !errors.As(err, &v) || v.Field != "max_objects" ||
		v.Reason != "18446744073709551615 is more than the 100 allowed" {
		t.Errorf("Count(2^64-1) = %v", err)
	}
	// Every duration field of every request is bounded before a handler
	// sees it, whatever the handler does with it.
	if err := Check(&waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true, TtlMs: math.MaxInt64}); !errors.As(err, &v) || v.Field != "ttl_ms" {
		t.Errorf("Check(ttl_ms 2^63-1) = %v, want a violation of ttl_ms", err)
	}
	if err := Check(&waldenv1.SetMaintenanceRequest{BrokerId: "b1", On: true, TtlMs: -5}); !errors.As(err, &v) || v.Field != "ttl_ms" {
		t.Errorf("Check(ttl_ms -5) = %v, want a violation of ttl_ms", err)
	}
	if err := Check(&waldenv1.WatchRequest{ProgressIntervalMs: math.MaxUint32}); !errors.As(err, &v) || v.Field != "progress_interval_ms" {
		t.Errorf("Check(progress_interval_ms 2^32-1) = %v, want a violation", err)
	}
	// Times (_unix_ms) are not durations.
	if err := Check(&waldenv1.SetMaintenance{BrokerId: "b1", IfUntilUnixMs: math.MaxInt64}); err != nil {
		t.Errorf("Check(if_until_unix_ms) = %v", err)
	}
}
