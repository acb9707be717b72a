package gossip

import (
	"errors"
	"strings"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	metas := []Meta{
		{Role: RoleCoordinator, ClusterName: "demo", ID: "c1", AdminAddr: "127.0.0.1:7001"},
		{Role: RoleAgent, ClusterName: "demo", ID: "b1", AgentAddr: "127.0.0.1:7501", AdminAddr: "10.0.0.7:7001"},
		{Role: RoleAgent, ClusterName: "prod-eu", ID: "broker-17", AgentAddr: "[fe80::1]:7501", Leaving: true},
	}
	for _, m := range metas {
		b, err := m.Encode()
		if err != nil {
			t.Fatalf("Encode(%+v): %v", m, err)
		}
		if len(b) > MetaMaxSize {
			t.Fatalf("Encode(%+v) is %d bytes", m, len(b))
		}
		got, err := DecodeMeta(b)
		if err != nil {
			t.Fatalf("DecodeMeta(Encode(%+v)): %v", m, err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
		// A later encoder may append fields; this decoder ignores them.
		got, err = DecodeMeta(append(b, 0x05, 'x', 'y', 'z', 'w', 'v'))
		if err != nil || got != m {
			t.Fatalf("DecodeMeta with trailing fields = %+v, %v; want %+v", got, err, m)
		}
	}
	// Compact: a typical agent entry is far below the limit.
	b, _ := metas[1].Encode()
	if len(b) > 64 {
		t.Errorf("typical agent metadata encodes to %d bytes, expected a compact encoding", len(b))
	}
}

func TestMetaEncodeErrors(t *testing.T) {
	big := Meta{Role: RoleAgent, ClusterName: "demo", ID: strings.Repeat("i", 200),
		AgentAddr: strings.Repeat("a", 200) + ":1", AdminAddr: strings.Repeat("b", 200) + ":1"}
	if _, err := big.Encode(); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("Encode(too large) = %v, want ErrMetaTooLarge", err)
	}
	bad := []Meta{
		{ClusterName: "demo", ID: "b1"},
		{Role: "observer", ClusterName: "demo", ID: "b1"},
		{Role: RoleAgent, ID: "b1"},
		{Role: RoleAgent, ClusterName: "demo"},
		{Role: RoleAgent, ClusterName: "demo", ID: "b1", AgentAddr: "no-port"},
	}
	for _, m := range bad {
		if _, err := m.Encode(); !errors.Is(err, ErrInvalidMeta) {
			t.Errorf("Encode(%+v) = %v, want ErrInvalidMeta", m, err)
		}
	}
}

func TestDecodeMetaErrors(t *testing.T) {
	good, err := Meta{Role: RoleAgent, ClusterName: "demo", ID: "b1", AgentAddr: "127.0.0.1:7501"}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"nil", nil, "empty"},
		{"json", []byte(`{"role":"agent"}`), "unknown encoding version"},
		{"version 2", append([]byte{2}, good[1:]...), "unknown encoding version 2"},
		{"short header", []byte{1, 1}, "truncated header"},
		{"role 0", append([]byte{1, 0}, good[2:]...), "unknown role code 0"},
		{"role 9", append([]byte{1, 9}, good[2:]...), "unknown role code 9"},
		{"no fields", []byte{1, 1, 0}, "cluster_name: bad length"},
		{"length beyond end", []byte{1, 1, 0, 10, 'a'}, "cluster_name: length 10 beyond the end"},
		{"truncated", good[:len(good)-3], "beyond the end"},
		{"empty cluster", []byte{1, 1, 0, 0, 2, 'c', '1', 0, 0}, "no cluster_name"},
		{"empty id", []byte{1, 1, 0, 1, 'd', 0, 0, 0}, "no id"},
		{"too long", append(append([]byte{}, good...), make([]byte, MetaMaxSize)...), "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := DecodeMeta(tt.b)
			if !errors.Is(err, ErrInvalidMeta) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("DecodeMeta = %+v, %v; want ErrInvalidMeta saying %q", m, err, tt.want)
			}
		})
	}
}

// FuzzDecodeMeta checks that no input makes the decoder panic and that
// whatever it accepts and can re-encode decodes to the same value.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{
		{Role: RoleCoordinator, ClusterName: "demo", ID: "c1", AdminAddr: "127.0.0.1:7001"},
		{Role: RoleAgent, ClusterName: "demo", ID: "b1", AgentAddr: "127.0.0.1:7501", Leaving: true},
	} {
		b, err := m.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 2, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		again, err := m.Encode()
		if err != nil {
			return // decodable but not something this version would send
		}
		m2, err := DecodeMeta(again)
		if err != nil || m2 != m {
			t.Fatalf("re-decode = %+v, %v; want %+v", m2, err, m)
		}
	})
}
