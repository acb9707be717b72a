package wal

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"walden/internal/testutil"
)

// mappedRSS returns how much of the mappings of path is resident in this
// process (the Rss of its entries in /proc/self/smaps), in bytes.
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	var total int64
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			in = f[len(f)-1] == path // a mapping's header line names its file last
		case in && len(f) >= 2 && f[0] == "Rss:":
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			total += kb << 10
		}
	}
	return total
}

// TestMappedScanGivesPagesBack: scanning a WAL through its mapping keeps
// only the chunks around the scan resident, not the whole file: a
// coordinator recovering a 1 GiB WAL held all of it in its RSS until the
// Reader was closed. The payloads stay readable (the pages come back from
// the page cache).
func TestMappedScanGivesPagesBack(t *testing.T) {
	const size = 96 << 20
	path, n, payloadLen := writeReleaseWAL(t, size)
	rd := openMapped(t, path)
	first := scanAll(t, rd, n)[0].Batch.Payload
	// The prefetcher gives pages back as it follows the scan; wait for it.
	// Without it the whole WAL (96 MiB) stays resident; with it about
	// prefetchAhead + releaseBehind chunks do (12 MiB), up to 31 MiB seen
	// under the race detector: half the WAL tells the two apart.
	bound := int64(size / 2)
	testutil.Eventually(t, 10*time.Second, "resident mapping around the scan only", func() error {
		if resident := mappedRSS(t, path); resident > bound {
			return errors.New(strconv.FormatInt(resident>>20, 10) + " MiB of the WAL resident after the scan, want at most " + strconv.FormatInt(bound>>20, 10) + " MiB")
		}
		return nil
	})
	if len(first) != payloadLen || first[0] != 0 {
		t.Fatalf("the first payload, given back and read again: %d bytes starting %d", len(first), first[0])
	}
}

// writeReleaseWAL writes a WAL of about size bytes of 256 KiB records of
// stream 1, record i's payload starting with byte(i), and returns its path,
// the number of records and the payload length.
func writeReleaseWAL(t *testing.T, size int) (string, int, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "wal")
	w, err := Create(path, CreateOptions{Capacity: int64(size) + HeaderRegionSize, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 256<<10)
	batches := make([]Batch, 4)
	var n int
	for written := 0; written+len(batches)*len(payload) < size-(4<<20); written += len(batches) * len(payload) {
		for i := range batches {
			payload[0] = byte(n)
			batches[i] = Batch{StreamID: 1, Epoch: 1, BaseOffset: uint64(n), Count: 1, Payload: append([]byte(nil), payload...)}
			n++
		}
		if _, err := w.AppendAll(context.Background(), batches); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path, n, len(payload)
}

// TestHoldMapsKeptBodiesBack: bodies kept past the scan, whose pages the
// scan gave back, are mapped in again by Hold (resident in this process, not
// a page fault each on their next read), with their bytes unchanged.
func TestHoldMapsKeptBodiesBack(t *testing.T) {
	const size = 64 << 20
	path, n, _ := writeReleaseWAL(t, size)
	rd := openMapped(t, path)
	if err := unix.Madvise(rd.mapped[:os.Getpagesize()], unix.MADV_POPULATE_READ); err != nil {
		t.Skipf("this kernel has no MADV_POPULATE_READ: %v", err)
	}
	var bodies [][]byte
	var held int64
	for _, rec := range scanAll(t, rd, n) {
		bodies = append(bodies, rec.Body)
		held += int64(len(rec.Body))
	}
	testutil.Eventually(t, 10*time.Second, "pages given back behind the scan", func() error {
		if resident := mappedRSS(t, path); resident > held/2 {
			return errors.New(strconv.FormatInt(resident>>20, 10) + " MiB of the WAL still resident")
		}
		return nil
	})
	rd.Hold(bodies)
	if resident := mappedRSS(t, path); resident < held*9/10 {
		t.Fatalf("after Hold %d MiB of the WAL resident, the kept bodies hold %d MiB", resident>>20, held>>20)
	}
	for i, b := range bodies {
		if b[BodyHeaderSize] != byte(i) {
			t.Fatalf("body %d starts its payload with %d after Hold", i, b[BodyHeaderSize])
		}
	}
}

// openMapped opens the WAL at path through its mapping, closed at the end
// of the test; it skips the test where the WAL cannot be mapped.
func openMapped(t *testing.T, path string) *Reader {
	t.Helper()
	rd, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rd.Close() })
	if rd.mapped == nil {
		t.Skip("the WAL could not be mapped here")
	}
	return rd
}

// scanAll reads every record of rd and checks there are want of them.
func scanAll(t *testing.T, rd *Reader, want int) []Record {
	t.Helper()
	var recs []Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	if len(recs) != want {
		t.Fatalf("scanned %d records, wrote %d", len(recs), want)
	}
	return recs
}
