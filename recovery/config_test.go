package recovery_test

import (
	"errors"
	"strings"
	"testing"

	"walden/recovery"
)

func TestDefaultMemoryBound(t *testing.T) {
	cfg := recovery.DefaultConfig()
	// 128 MiB × 3 + 1 × 10 × 8 MiB, as docs/recovery.md says.
	if got := cfg.MemoryBound(); got != 464<<20 {
		t.Fatalf("default MemoryBound %d MiB, want 464 MiB", got>>20)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateRefusesAMemoryBoundAboveTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*recovery.Config)
		key  string
	}{
		{"large objects, many at a time", func(c *recovery.Config) { c.ObjectSize, c.UploadObjects = 512<<20, 8 }, "recovery.upload_objects"},
		{"one large object", func(c *recovery.Config) { c.ObjectSize, c.PartSize, c.UploadConcurrency = 512<<20, 256<<20, 16 }, "recovery.part_size"},
		{"many large parts", func(c *recovery.Config) { c.PartSize, c.ObjectSize, c.UploadConcurrency = 64<<20, 64<<20, 256 }, "recovery.part_size"},
	} {
		cfg := recovery.DefaultConfig()
		tc.set(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, recovery.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.key+":") || !strings.Contains(err.Error(), "MiB") {
			t.Errorf("%s (bound %d MiB): %v, want an error naming %s", tc.name, cfg.MemoryBound()>>20, err, tc.key)
		}
	}
	// At the limit is accepted: 512 MiB × 6 + 4 × 10 × 8 MiB = 3,392 MiB.
	cfg := recovery.DefaultConfig()
	cfg.ObjectSize, cfg.UploadObjects = 512<<20, 4
	if err := cfg.Validate(); err != nil {
		t.Fatalf("bound %d MiB: %v", cfg.MemoryBound()>>20, err)
	}
}
