package raftnode

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"
)

// TestRaftLogNamesMembers: raft's own progress is logged at debug, with
// members named instead of their hexadecimal raft ids; its warnings stay
// warnings, named too.
func TestRaftLogNamesMembers(t *testing.T) {
	var buf bytes.Buffer
	r := &raftLogger{l: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	r.learn(RaftID("c1"), "c1")
	r.learn(RaftID("c2"), "c2")
	c1, c2 := strconv.FormatUint(RaftID("c1"), 16), strconv.FormatUint(RaftID("c2"), 16)
	r.Infof("%s became leader at term 3", c1)
	r.Warningf("%s stepped down to follower since quorum is not active (%s silent)", c1, c2)
	out := buf.String()
	if strings.Contains(out, c1) || strings.Contains(out, c2) {
		t.Fatalf("hex ids left in %q", out)
	}
	if !strings.Contains(out, `level=DEBUG msg="c1 became leader at term 3"`) || !strings.Contains(out, `level=WARN msg="c1 stepped down to follower since quorum is not active (c2 silent)"`) {
		t.Fatalf("log %q", out)
	}
}
