package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"walden/broker/brokertest"
	"walden/objstore/s3test"
)

func runCmd(ctx context.Context, cmd *cobra.Command, args ...string) (string, error) {
	root := &cobra.Command{Use: "walden", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(cmd)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

// TestBrokerLoadVerifyCommands runs `walden broker` from a config file
// against a stand-in coordinator, then `walden load` and `walden verify`
// with -o json.
func TestBrokerLoadVerifyCommands(t *testing.T) {
	coord, err := brokertest.Start("demo", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Stop()
	dir := t.TempDir()
	fakeS3 := s3test.StartFake(t)
	endpoint := fakeS3.Endpoint
	cfgPath := filepath.Join(dir, "broker.yaml")
	yaml := fmt.Sprintf(`broker_id: b1
cluster_name: demo
listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
coordinators: [%s]
gossip: {listen: 127.0.0.1:0}
wal: {path: %s, capacity: 1048576}
s3: {endpoint: %q, bucket: %s, path_style: true, access_key_id: a, secret_access_key: b}
streams: [1, 2]
upload_interval: 100ms
lease_safety_margin: 200ms
log: {level: error}
`, coord.Addr, filepath.Join(dir, "b1.wal"), endpoint, fakeS3.Bucket)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	brokerDone := make(chan error, 1)
	go func() {
		_, err := runCmd(ctx, newBrokerCmd(), "broker", "--config", cfgPath)
		brokerDone <- err
	}()
	defer func() {
		cancel()
		select {
		case err := <-brokerDone:
			if err != nil {
				t.Errorf("broker: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("broker did not stop")
		}
	}()
	// Wait until both streams are opened by b1.
	end := time.Now().Add(10 * time.Second)
	for len(coord.State().Streams("b1", "opened")) != 2 {
		if time.Now().After(end) {
			t.Fatal("broker did not open its streams")
		}
		time.Sleep(10 * time.Millisecond)
	}

	ledger := filepath.Join(dir, "ledger.jsonl")
	out, err := runCmd(context.Background(), newLoadCmd(), "load", "--coordinators", coord.Addr, "--rate", "300",
		"--duration", "500ms", "--ledger", ledger, "-o", "json")
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out)
	}
	var lrep map[string]any
	if err := json.Unmarshal([]byte(out), &lrep); err != nil {
		t.Fatalf("load output %q: %v", out, err)
	}
	if lrep["acked"].(float64) == 0 || len(lrep["streams"].([]any)) != 2 {
		t.Fatalf("load report %v", lrep)
	}
	out, err = runCmd(context.Background(), newVerifyCmd(), "verify", "--coordinators", coord.Addr, "--ledger", ledger, "-o", "json")
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	var vrep map[string]any
	if err := json.Unmarshal([]byte(out), &vrep); err != nil {
		t.Fatalf("verify output %q: %v", out, err)
	}
	for _, k := range []string{"acked", "present", "lost", "gaps", "duplicates"} {
		if _, ok := vrep[k].(float64); !ok {
			t.Fatalf("verify output lacks %q: %s", k, out)
		}
	}
	if vrep["lost"].(float64) != 0 || vrep["acked"] != lrep["acked"] || vrep["present"] != lrep["acked"] {
		t.Fatalf("verify %v, load %v", vrep, lrep)
	}

	// A ledger entry that is not in the stream fails verify (exit status 1).
	f, _ := os.OpenFile(ledger, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"stream":1,"offset":99999,"id":"1/99999"}` + "\n")
	f.Close()
	out, err = runCmd(context.Background(), newVerifyCmd(), "verify", "--coordinators", coord.Addr, "--ledger", ledger, "--wait", "200ms", "-o", "json")
	if err == nil || !strings.Contains(err.Error(), "lost 1") {
		t.Fatalf("verify of a tampered ledger: %v\n%s", err, out)
	}
}

func TestLoadVerifyFlagErrors(t *testing.T) {
	for _, c := range []struct {
		cmd  *cobra.Command
		args []string
		want string
	}{
		{newLoadCmd(), []string{"load", "--coordinators", "127.0.0.1:1", "--ledger", "x", "--streams", "1,a"}, "--streams"},
		{newLoadCmd(), []string{"load", "--coordinators", "127.0.0.1:1", "--ledger", "x", "-o", "yaml"}, "--output"},
		{newLoadCmd(), []string{"load", "--ledger", "x"}, "--coordinators"},
		{newVerifyCmd(), []string{"verify", "--coordinators", "127.0.0.1:1", "--broker-addrs", "b1"}, "--broker-addrs"},
		{newBrokerCmd(), []string{"broker"}, "--config"},
	} {
		if _, err := runCmd(context.Background(), c.cmd, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
