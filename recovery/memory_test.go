package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"walden/internal/testutil"
	"walden/objstore"
	waldenv1 "walden/proto/walden/v1"
)

// TestRecoveryMemoryIsBounded recovers a WAL of many objects into a store
// that holds each upload until the build goroutine can go no further (it
// has built every object it may build ahead), then measures the live heap:
// it must stay within Config.ObjectMemory, object_size × (upload_objects +
// 2), above what the test held before, however many objects the WAL holds.
// The store reads bodies without keeping them, so only the recovery's own
// buffers count (the transfer manager's part buffers are the objstore
// client's, outside this test).
func TestRecoveryMemoryIsBounded(t *testing.T) {
	const objectSize = 16 << 20
	const objects = 6
	walPath := filepath.Join(t.TempDir(), "b1.wal")
	streams, _ := writeBenchWAL(t, walPath, objects*objectSize)
	for _, uploaders := range []int{1, 2} {
		t.Run(fmt.Sprintf("upload_objects=%d", uploaders), func(t *testing.T) {
			cfg := testConfig()
			cfg.PartSize = 5 << 20
			cfg.ObjectSize = objectSize
			cfg.UploadObjects = uploaders
			store := &heldStore{t: t, uploads: map[string]int64{}}
			c := newTestCluster(t, "c1")
			epoch := c.must(&waldenv1.RegisterBroker{BrokerId: "b1", Wal: &waldenv1.WalLocation{Path: walPath}}).GetRegisterBroker().GetEpoch()
			for s := 1; s <= streams; s++ {
				c.must(&waldenv1.OpenStreamRequest{BrokerId: "b1", BrokerEpoch: epoch, StreamId: uint64(s)})
			}
			exe := newExecutor(c, "c1", cfg, store, nil, nil)
			base := liveHeap()
			j := c.declare("b1", epoch, "c1")
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline(5*time.Minute))
			defer cancel()
			if err := exe.Run(ctx, j.GetJobId(), 1); err != nil {
				t.Fatal(err)
			}
			j, _ = c.s.Job(j.GetJobId())
			if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
				t.Fatalf("job %s: %s", j.GetJobState().Name(), j.GetError())
			}
			store.mu.Lock()
			defer store.mu.Unlock()
			if len(store.uploads) < objects {
				t.Fatalf("%d objects uploaded, want at least %d", len(store.uploads), objects)
			}
			bound := cfg.ObjectMemory()
			const slack = 6 << 20 // the catalog, the plan, the builder's batch lists, the reader
			grew := int64(store.peak) - int64(base)
			t.Logf("%d objects of up to %d MiB, %d uploading at a time: live heap grew by %.1f MiB at most (bound %d MiB + %d MiB)",
				len(store.uploads), objectSize>>20, uploaders, float64(grew)/(1<<20), bound>>20, slack>>20)
			if grew > bound+slack {
				t.Errorf("live heap grew by %.1f MiB during the recovery, above object_size × (upload_objects + 2) = %d MiB (+ %d MiB)",
					float64(grew)/(1<<20), bound>>20, slack>>20)
			}
		})
	}
}

// liveHeap collects garbage and returns the bytes of live heap objects.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// buildBlocked reports whether the recovery's build goroutine is gone or
// waiting in the build itself (for an uploader or a buffer), not for the
// WAL reader.
func buildBlocked() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "recovery.(*attempt).build(") {
			continue
		}
		lines := strings.Split(g, "\n")
		if !strings.Contains(lines[0], "[select") && !strings.Contains(lines[0], "[chan") {
			return false
		}
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "runtime.") {
				continue
			}
			return strings.HasPrefix(l, "walden/recovery.(*attempt).build(") || strings.HasPrefix(l, "walden/recovery.(*bufferPool).get(")
		}
		return false
	}
	return true
}

// heldStore is a recovery.Store that keeps nothing but each key's size. An
// upload waits for the build goroutine to block before it reads the body,
// and records the live heap at that moment, the recovery's fullest.
type heldStore struct {
	t       testing.TB
	mu      sync.Mutex
	uploads map[string]int64
	peak    uint64
}

func (s *heldStore) Upload(ctx context.Context, key string, body io.Reader, size int64, progress func(int64)) (objstore.UploadResult, error) {
	deadline := time.Now().Add(testutil.Deadline(time.Minute))
	for !buildBlocked() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return objstore.UploadResult{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	live := liveHeap()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	n, err := io.Copy(h, body)
	if err != nil {
		return objstore.UploadResult{}, err
	}
	if n != size {
		return objstore.UploadResult{}, fmt.Errorf("read %d bytes, declared %d", n, size)
	}
	if progress != nil {
		progress(n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uploads[key] = n
	s.peak = max(s.peak, live)
	return objstore.UploadResult{Key: key, Size: n, CRC32C: h.Sum32(), Parts: 1}, nil
}

func (s *heldStore) UploadAt(ctx context.Context, key string, body io.ReaderAt, size int64, progress func(int64)) (objstore.UploadResult, error) {
	return s.Upload(ctx, key, io.NewSectionReader(body, 0, size), size, progress)
}

func (s *heldStore) Head(_ context.Context, key string) (objstore.ObjectInfo, error) {
	return objstore.ObjectInfo{}, fmt.Errorf("head %s: %w", key, objstore.ErrNotFound)
}

func (s *heldStore) Delete(context.Context, string) error { return nil }

func (s *heldStore) List(_ context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []objstore.ObjectInfo
	for k, n := range s.uploads {
		if strings.HasPrefix(k, prefix) {
			out = append(out, objstore.ObjectInfo{Key: k, Size: n})
		}
	}
	return out, nil
}

func (s *heldStore) AbortIncompleteUploads(context.Context, string) (int, error) { return 0, nil }

func (s *heldStore) Prefix() string { return "" }

func (s *heldStore) GetRange(context.Context, string, int64, int64) ([]byte, error) {
	return nil, errors.New("heldStore keeps no bytes")
}
