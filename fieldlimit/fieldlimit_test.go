package fieldlimit

import (
	"errors"
	"strings"
	"testing"

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
