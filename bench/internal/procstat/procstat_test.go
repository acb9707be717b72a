package procstat

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and parentheses; utime 150, stime 50.
	line := []byte("4242 (walden (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 12 0 100 0 0")
	got, err := ParseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * time.Second; got != want {
		t.Fatalf("cpu %v, want %v", got, want)
	}
	if _, err := ParseStatCPU([]byte("4242 (walden) S 1")); err == nil {
		t.Fatal("a short line parsed")
	}
}

func TestParseStatusKB(t *testing.T) {
	st := []byte("Name:\twalden\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n")
	if got := ParseStatusKB(st, "VmRSS:"); got != 102400 {
		t.Fatalf("VmRSS %d", got)
	}
	if got := ParseStatusKB(st, "VmHWM:"); got != 204800 {
		t.Fatalf("VmHWM %d", got)
	}
}

// TestReadSelf reads this process: the CPU it burns shows in both its stat
// and its schedstat.
func TestReadSelf(t *testing.T) {
	pid := os.Getpid()
	a, err := Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	sa := ReadSched(pid)
	deadline := time.Now().Add(10 * time.Second)
	var b Sample
	for {
		x := 0
		for i := 0; i < 1_000_000; i++ {
			x += i * i
		}
		_ = x
		if b, err = Read(pid); err != nil {
			t.Fatal(err)
		}
		if b.CPU >= a.CPU+50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cpu %v after 10 s of work, from %v", b.CPU, a.CPU)
		}
	}
	if b.RSS <= 0 {
		t.Fatalf("rss %d", b.RSS)
	}
	if c := Cores(a, b); c <= 0 {
		t.Fatalf("cores %v", c)
	}
	if sb := ReadSched(pid); sb.Run <= sa.Run || sb.Slices <= 0 {
		t.Fatalf("run %v in %d slices, from %v", sb.Run, sb.Slices, sa.Run)
	}
}

func TestParseIO(t *testing.T) {
	got, err := ParseIO([]byte("rchar: 6976\nwchar: 12\nsyscr: 10\nsyscw: 3\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (IO{ReadBytes: 6976, WriteBytes: 12, ReadCalls: 10, WriteCalls: 3}); got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
	if _, err := ParseIO([]byte("rchar: 1\nwchar: 2\n")); err == nil {
		t.Fatal("a text without syscr and syscw parsed")
	}
	if _, err := ParseIO([]byte("rchar: x\nwchar: 2\nsyscr: 1\nsyscw: 1\n")); err == nil {
		t.Fatal("a text with a bad number parsed")
	}
}
