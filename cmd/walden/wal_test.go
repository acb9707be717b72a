package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"walden/wal"
)

// runWAL runs `walden wal ...` in-process on a fresh command tree.
func runWAL(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "walden", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newWALCmd())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"wal"}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestWALGenInspectJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torn.wal")
	if _, err := runWAL(t, "gen", path, "--records", "40", "--streams", "3", "--payload", "200", "--count", "2",
		"--capacity", "1048576", "--node-id", "7", "--node-epoch", "42", "--trim-at", "4", "--torn-tail"); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	out, err := runWAL(t, "inspect", path, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("inspect changed the file")
	}
	// The shape the issue names, checked on a generic decoding.
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	hdr, ok := doc["header"].(map[string]any)
	if !ok {
		t.Fatalf("no header object: %s", out)
	}
	for _, k := range []string{"magic", "version", "capacity", "trim_offset", "node_id", "node_epoch", "shutdown_type"} {
		if _, ok := hdr[k]; !ok {
			t.Errorf("header.%s missing", k)
		}
	}
	for _, k := range []string{"records", "skipped_bytes", "streams"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("%s missing", k)
		}
	}
	var r walInspectJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Header.Magic != "0x01234567" || r.Header.Version != 1 || r.Header.Capacity != 1<<20 ||
		r.Header.NodeID != 7 || r.Header.NodeEpoch != 42 || r.Header.ShutdownType != "ungraceful" {
		t.Errorf("header %+v", r.Header)
	}
	// 40 records, the first 4 trimmed, the torn 41st never returned.
	if r.Records != 36 {
		t.Errorf("records %d, want 36", r.Records)
	}
	if r.SkippedBytes <= 0 || r.EndReason != wal.ReasonBodyCRC {
		t.Errorf("skipped %d, end %q", r.SkippedBytes, r.EndReason)
	}
	// Record i goes to stream i%3+1 as that stream's batch k = i/3, with
	// offsets [2k, 2k+2). Streams get 14, 13 and 13 batches; trimming
	// records 0-3 removes batches 0 and 1 of stream 1 and batch 0 of
	// streams 2 and 3.
	want := []walStreamJSON{
		{StreamID: 1, FirstOffset: 4, EndOffset: 28, Records: 12, PayloadBytes: 12 * 200},
		{StreamID: 2, FirstOffset: 2, EndOffset: 26, Records: 12, PayloadBytes: 12 * 200},
		{StreamID: 3, FirstOffset: 2, EndOffset: 26, Records: 12, PayloadBytes: 12 * 200},
	}
	if len(r.Streams) != len(want) {
		t.Fatalf("streams %+v", r.Streams)
	}
	for i := range want {
		if r.Streams[i] != want[i] {
			t.Errorf("stream %d: %+v, want %+v", i, r.Streams[i], want[i])
		}
	}
}

func TestWALGenInspectTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clean.wal")
	out, err := runWAL(t, "gen", path, "--records", "10", "--streams", "2", "--payload", "64", "--capacity", "262144", "--group", "3")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "wrote 10 records") {
		t.Errorf("gen output %q", out)
	}
	out, err = runWAL(t, "inspect", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"version        1 (magic 0x01234567)", "shutdown_type  graceful", "records        10",
		"STREAM  FIRST_OFFSET  END_OFFSET  RECORDS  PAYLOAD_BYTES  GAPS", "1       0             5           5        320            0"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
}

func TestWALCommandErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.wal")
	if _, err := runWAL(t, "gen", good, "--records", "3", "--capacity", "65536"); err != nil {
		t.Fatal(err)
	}
	img, _ := os.ReadFile(good)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badCRC := append([]byte(nil), img...)
	badCRC[30] ^= 1
	badCRC[wal.BlockSize+30] ^= 1
	cases := []struct {
		name string
		args []string
		is   error
		text string
	}{
		{"not a wal", []string{"inspect", write("text", bytes.Repeat([]byte("not a wal\n"), 2000))}, wal.ErrNotWAL, "not a WAL"},
		{"both slots bad crc", []string{"inspect", write("crc", badCRC)}, wal.ErrHeaderCRC, "CRC"},
		{"capacity vs file size", []string{"inspect", write("short", img[:len(img)-wal.BlockSize])}, wal.ErrCapacityMismatch, "capacity"},
		{"missing file", []string{"inspect", filepath.Join(dir, "missing")}, os.ErrNotExist, "missing"},
		{"bad output", []string{"inspect", good, "-o", "yaml"}, nil, "--output"},
		{"gen over existing file", []string{"gen", good}, wal.ErrExists, "good.wal"},
		{"gen bad capacity", []string{"gen", filepath.Join(dir, "x"), "--capacity", "5000"}, wal.ErrBadCapacity, "capacity"},
		{"gen ring too small", []string{"gen", filepath.Join(dir, "y"), "--records", "10", "--payload", "3000", "--capacity", "16384"}, wal.ErrFull, "record 2"},
		{"gen bad group", []string{"gen", filepath.Join(dir, "g"), "--group", "0"}, nil, "--group"},
		{"gen bad trim", []string{"gen", filepath.Join(dir, "z"), "--records", "2", "--trim-at", "3"}, nil, "--trim-at"},
		{"no file", []string{"inspect"}, nil, "arg"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runWAL(t, tc.args...)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v, want %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q lacks %q", err, tc.text)
			}
		})
	}
}
