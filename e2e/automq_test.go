package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"walden/automq/devcontroller"
	"walden/internal/devcluster"
)

// TestE2EShortAutomqDevCommand runs `walden dev --broker automq` as a user
// does: the development AutoMQ controller, three coordinators recovering
// with recovery.action automq, three AutoMQ-mode brokers each started by
// its agent in watchdog mode, load, kill -9 of b1's broker process (its
// agent lives on), and the verify through AutoMQ's objects in S3. It checks
// the outcome: nothing lost, nothing twice, no gap, the failover recovered
// records from the WAL, the new leaders were answered STREAM_NOT_CLOSED
// before the failover closed the streams and lead them now.
func TestE2EShortAutomqDevCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// walden's default policy: with lease_ttl 1s a loaded machine lets a
	// healthy broker's lease lapse now and then, and its watchdog kills it.
	cmd := exec.CommandContext(ctx, waldenBin, "dev", "--broker", "automq", "-o", "json", "--warmup", "2s", "--dir", t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("walden dev --broker automq: %v\n%s\n%s", err, out, stderr.String())
	}
	var sum devcluster.Summary
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("walden dev -o json: %v\n%s", err, out)
	}
	if sum.Acked == 0 || sum.Lost != 0 || sum.Gaps != 0 || sum.Duplicates != 0 || sum.Unbacked != 0 || sum.Present != sum.Acked {
		t.Fatalf("summary: %s", out)
	}
	if sum.RecordsRecovered == 0 || sum.UploadedBytes == 0 || sum.BacklogBytes == 0 {
		t.Fatalf("the failover recovered nothing from the victim's WAL: %s", out)
	}
	a := sum.Automq
	if a == nil || a.NodeID != 1 || a.NodeEpoch <= 0 || !a.WALReset || len(a.Objects) == 0 || a.NotClosedAnswers == 0 || len(a.Streams) != sum.VictimStreams {
		t.Fatalf("AutoMQ summary: %s", out)
	}
	for _, s := range a.Streams {
		if s.Leader == "" || s.Leader == sum.Victim || s.EndOffsetAfter <= s.EndOffsetBefore || s.Records == 0 {
			t.Fatalf("stream %d after the failover: %+v", s.StreamID, s)
		}
	}
	t.Logf("detection %d ms, worst stream unavailable %d ms, recovered %d bytes in %d record batches, %d STREAM_NOT_CLOSED answers",
		sum.DetectionMs, sum.MaxUnavailableMs, sum.UploadedBytes, sum.RecordsRecovered, a.NotClosedAnswers)
}

// TestE2EAutomqKillAndRestart kills b1's broker under load, lets the
// cluster fail node 1 over at the AutoMQ controller, then watches its agent
// start it again: a new node epoch registered at the controller without the
// failover flag, nothing to upload (the recovery reset its WAL), no stream
// led (the others lead them). A new load through the brokers and
// `walden verify --automq` from the command line find every record.
func TestE2EAutomqKillAndRestart(t *testing.T) {
	needFull(t)
	c := startCluster(t, func(o *devcluster.Options) {
		o.Broker = devcluster.BrokerAutomq
		o.UploadInterval = time.Hour
		// walden's defaults: with lease_ttl 1s a loaded machine lets a
		// healthy broker's lease lapse now and then, and its watchdog
		// kills it.
		o.Policy = nil
	})
	ctx := context.Background()
	sc := &devcluster.Failover{Warmup: 3 * time.Second, After: time.Second, Timeout: 60 * time.Second, Say: logSay(t)}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, sum)
	if sum.Automq == nil || sum.RecordsRecovered == 0 {
		t.Fatalf("summary %+v", sum)
	}
	b1 := c.Proc("b1")
	var restarted devcontroller.NodeView
	err = devcluster.Poll(ctx, 60*time.Second, "b1 started again by its agent", func() error {
		ab, err := c.AgentBroker(ctx, b1)
		if err != nil {
			return err
		}
		if ab.Starts < 2 || ab.State != "up" {
			return fmt.Errorf("agent: %+v", ab)
		}
		v, err := c.View().State(ctx)
		if err != nil {
			return err
		}
		for _, n := range v.Nodes {
			if n.NodeID == 1 {
				restarted = n
			}
		}
		if restarted.NodeEpoch <= sum.Automq.NodeEpoch || restarted.FailoverMode {
			return fmt.Errorf("node 1 at the controller: %+v", restarted)
		}
		st, err := c.BrokerStatus(ctx, b1)
		if err != nil {
			return err
		}
		if !st.GetServing() || st.GetBrokerEpoch() != uint64(restarted.NodeEpoch) {
			return fmt.Errorf("b1's status: %+v", st)
		}
		if len(st.GetStreams()) != 0 {
			return fmt.Errorf("b1 leads %v again", st.GetStreams())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("b1 started again as node 1 epoch %d (failed over at %d)", restarted.NodeEpoch, sum.Automq.NodeEpoch)

	// More load through the brokers and the verify from the command line.
	ledger := filepath.Join(t.TempDir(), "more.jsonl")
	var streams []string
	for _, id := range c.AllStreams() {
		streams = append(streams, fmt.Sprint(id))
	}
	load := exec.Command(waldenBin, append([]string{"load", "--brokers", strings.Join(c.BrokerAddrs(), ","), "--streams", strings.Join(streams, ","),
		"--rate", "200", "--duration", "3s", "--ledger", ledger, "-o", "json"}, clientFlags(t, c, readerID)...)...)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("walden load --brokers: %v\n%s", err, out)
	}
	if err := c.UploadAutomqWALs(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	s3 := c.S3Config
	verify := exec.Command(waldenBin, "verify", "--automq", c.MetadataURL(), "--s3-endpoint", s3.Endpoint, "--s3-bucket", s3.Bucket,
		"--s3-path-style", "--ledger", ledger, "-o", "json")
	verify.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3.AccessKeyID, "AWS_SECRET_ACCESS_KEY="+s3.SecretAccessKey)
	out, err := verify.Output()
	if err != nil {
		t.Fatalf("walden verify --automq: %v\n%s", err, out)
	}
	var rep struct{ Acked, Present, Lost, Gaps, Duplicates int64 }
	if err := json.Unmarshal(out, &rep); err != nil || rep.Acked == 0 || rep.Present != rep.Acked || rep.Lost != 0 || rep.Duplicates != 0 {
		t.Fatalf("walden verify --automq: %v\n%s", err, out)
	}
}
