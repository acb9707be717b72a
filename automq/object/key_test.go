package object

import (
	"errors"
	"math"
	"testing"
)

func TestKey(t *testing.T) {
	for _, c := range []struct {
		cluster string
		id      int64
		want    string
	}{
		// The README's examples.
		{"3Mv2fKxhR0u1Ab9CdEfGhQ", 1, "10000000/_kafka_3Mv2fKxhR0u1Ab9CdEfGhQ/1"},
		{"golden-cluster", 703710, "edcba000/_kafka_golden-cluster/703710"},
		{"3Mv2fKxhR0u1Ab9CdEfGhQ", 4611686018427387900, "cffffffffffffff3/_kafka_3Mv2fKxhR0u1Ab9CdEfGhQ/4611686018427387900"},
		{"c", 0, "00000000/_kafka_c/0"},
		{"c", 0xffffffff, "ffffffff/_kafka_c/4294967295"},
		{"c", 1 << 32, "000000001/_kafka_c/4294967296"},
		{"c", math.MaxInt64, "fffffffffffffff7/_kafka_c/9223372036854775807"},
	} {
		got, err := Key(c.cluster, c.id)
		if err != nil || got != c.want {
			t.Errorf("Key(%q, %d) = %q, %v; expected %q", c.cluster, c.id, got, err, c.want)
		}
		if id, err := ParseKey(c.cluster, c.want); err != nil || id != c.id {
			t.Errorf("ParseKey(%q) = %d, %v", c.want, id, err)
		}
	}
}

func TestKeyRefusals(t *testing.T) {
	if _, err := Key("c", -1); !errors.Is(err, ErrInvalidObjectID) {
		t.Fatalf("negative id: %v", err)
	}
	for _, cl := range []string{"", "a/b"} {
		if _, err := Key(cl, 1); !errors.Is(err, ErrInvalidClusterID) {
			t.Fatalf("cluster %q: %v", cl, err)
		}
	}
	for _, k := range []string{
		"10000000/_kafka_c/1/x",     // four parts
		"10000000/_kafka_c",         // two parts
		"10000000/_kafka_d/1",       // other cluster
		"20000000/_kafka_c/1",       // prefix of another id
		"1000000/_kafka_c/1",        // prefix not padded
		"10000000/_kafka_c/01",      // id not as written
		"10000000/_kafka_c/-1",      // negative
		"10000000/_kafka_c/one",     // not a number
		"10000000/_kafka_c/1" + " ", // trailing space
	} {
		if _, err := ParseKey("c", k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q): %v", k, err)
		}
	}
}

func TestAttributes(t *testing.T) {
	// The README's examples.
	for _, c := range []struct {
		v int32
		a Attributes
	}{
		{0, Attributes{}},
		{4, Attributes{Bucket: 1}},
		{12, Attributes{Bucket: 3}},
		{262153, Attributes{Type: TypeComposite, Bucket: 2, DeepDelete: true}},
		{1, Attributes{Type: TypeComposite}},
		{1 << 18, Attributes{DeepDelete: true}},
		{MaxBucket << 2, Attributes{Bucket: MaxBucket}},
	} {
		got, err := c.a.Encode()
		if err != nil || got != c.v {
			t.Errorf("%+v.Encode() = %d, %v; expected %d", c.a, got, err, c.v)
		}
		a, err := DecodeAttributes(c.v)
		if err != nil || a != c.a {
			t.Errorf("DecodeAttributes(%d) = %+v, %v; expected %+v", c.v, a, err, c.a)
		}
	}
	if _, err := DecodeAttributes(AttributesUnset); !errors.Is(err, ErrAttributesUnset) {
		t.Fatalf("-1: %v", err)
	}
	for _, v := range []int32{2, 3, 1 << 19, math.MinInt32, 0x8000 << 2, 0xFFFF << 2, -2} {
		if _, err := DecodeAttributes(v); !errors.Is(err, ErrInvalidAttributes) {
			t.Errorf("DecodeAttributes(%#x): %v", v, err)
		}
	}
	for _, a := range []Attributes{{Type: 2}, {Bucket: -1}, {Bucket: MaxBucket + 1}} {
		if _, err := a.Encode(); !errors.Is(err, ErrInvalidAttributes) {
			t.Errorf("%+v.Encode(): %v", a, err)
		}
	}
	if TypeNormal.String() != "normal" || TypeComposite.String() != "composite" || ObjectType(3).String() != "unknown(3)" {
		t.Fatal("type names")
	}
}
