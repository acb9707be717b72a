package recovery_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"walden/objstore/s3test"
	waldenv1 "walden/proto/walden/v1"
	"walden/recovery"
)

// ec2StandIn is a local stand-in of the EC2 API (query protocol, XML
// answers) for AttachVolume, DescribeVolumes, DetachVolume and
// StopInstances. It is not a simulator of EC2: it CHECKS every request it
// receives — SigV4 signature header for service ec2, API version, the
// required parameters and their values (the volume and instances the test
// expects) — records the calls, and plays the attachment through
// attaching → attached (the "device" appears as a file, a copy of the WAL,
// once attached) → detaching. Any unexpected request fails the test.
type ec2StandIn struct {
	t          *testing.T
	volume     string // the only volume that exists
	instance   string // the coordinator's instance
	stopTarget string // the instance a fence may stop
	device     string // the device name AttachVolume must ask for
	devPath    string // where the attached device appears
	walPath    string // its content

	mu       sync.Mutex
	calls    []string
	state    string // "", attaching, attached
	describe int
	stopped  bool
}

func (s *ec2StandIn) fail(w http.ResponseWriter, code, msg string) {
	s.t.Errorf("ec2 stand-in: %s: %s", code, msg)
	w.WriteHeader(http.StatusBadRequest)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>r</RequestID></Response>`, code, msg)
}

func (s *ec2StandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	if r.Method != http.MethodPost || !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AKIDTEST/") || !strings.Contains(auth, "/us-east-1/ec2/aws4_request") {
		s.fail(w, "AuthFailure", "unsigned or wrongly signed request: "+r.Method+" "+auth)
		return
	}
	if err := r.ParseForm(); err != nil {
		s.fail(w, "MalformedQueryString", err.Error())
		return
	}
	f := r.PostForm
	if f.Get("Version") != "2016-11-15" {
		s.fail(w, "InvalidParameterValue", "Version "+f.Get("Version"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	action := f.Get("Action")
	s.calls = append(s.calls, action)
	const ns = `xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"`
	switch action {
	case "StopInstances":
		if f.Get("InstanceId.1") != s.stopTarget || f.Get("InstanceId.2") != "" || f.Get("Force") != "true" {
			s.fail(w, "InvalidParameterValue", "StopInstances "+f.Encode())
			return
		}
		prev := "running"
		if s.stopped {
			prev = "stopping"
		}
		s.stopped = true
		fmt.Fprintf(w, `<StopInstancesResponse %s><requestId>r</requestId><instancesSet><item><instanceId>%s</instanceId><currentState><code>64</code><name>stopping</name></currentState><previousState><code>16</code><name>%s</name></previousState></item></instancesSet></StopInstancesResponse>`, ns, s.stopTarget, prev)
	case "AttachVolume":
		if f.Get("VolumeId") != s.volume || f.Get("InstanceId") != s.instance || f.Get("Device") != s.device {
			s.fail(w, "InvalidParameterValue", "AttachVolume "+f.Encode())
			return
		}
		if s.state != "" {
			s.fail(w, "VolumeInUse", "already attached to "+s.instance+" (the plugin must check DescribeVolumes first)")
			return
		}
		s.state, s.describe = "attaching", 0
		fmt.Fprintf(w, `<AttachVolumeResponse %s><requestId>r</requestId><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>attaching</status><attachTime>2026-01-01T00:00:00.000Z</attachTime></AttachVolumeResponse>`, ns, s.volume, s.instance, s.device)
	case "DescribeVolumes":
		if f.Get("VolumeId.1") != s.volume || f.Get("VolumeId.2") != "" {
			s.fail(w, "InvalidVolume.NotFound", "DescribeVolumes "+f.Encode())
			return
		}
		att := ""
		if s.state != "" {
			s.describe++
			if s.state == "attaching" && s.describe >= 2 {
				s.state = "attached"
				data, err := os.ReadFile(s.walPath)
				if err != nil {
					s.t.Error(err)
				}
				if err := os.WriteFile(s.devPath, data, 0o444); err != nil {
					s.t.Error(err)
				}
			}
			att = fmt.Sprintf(`<item><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>%s</status><attachTime>2026-01-01T00:00:00.000Z</attachTime><deleteOnTermination>false</deleteOnTermination></item>`, s.volume, s.instance, s.device, s.state)
		}
		fmt.Fprintf(w, `<DescribeVolumesResponse %s><requestId>r</requestId><volumeSet><item><volumeId>%s</volumeId><size>8</size><availabilityZone>us-east-1a</availabilityZone><status>in-use</status><multiAttachEnabled>true</multiAttachEnabled><volumeType>io2</volumeType><attachmentSet>%s</attachmentSet></item></volumeSet></DescribeVolumesResponse>`, ns, s.volume, att)
	case "DetachVolume":
		if f.Get("VolumeId") != s.volume || f.Get("InstanceId") != s.instance || s.state != "attached" {
			s.fail(w, "IncorrectState", "DetachVolume "+f.Encode()+" in state "+s.state)
			return
		}
		s.state = ""
		_ = os.Remove(s.devPath)
		fmt.Fprintf(w, `<DetachVolumeResponse %s><requestId>r</requestId><volumeId>%s</volumeId><instanceId>%s</instanceId><device>%s</device><status>detaching</status><attachTime>2026-01-01T00:00:00.000Z</attachTime></DetachVolumeResponse>`, ns, s.volume, s.instance, s.device)
	default:
		s.fail(w, "InvalidAction", action)
	}
}

func (s *ec2StandIn) callList() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	// collapse repeated DescribeVolumes polls
	var out []string
	for _, c := range s.calls {
		if len(out) > 0 && c == "DescribeVolumes" && out[len(out)-1] == "DescribeVolumes+" {
			continue
		}
		if c == "DescribeVolumes" {
			c = "DescribeVolumes+"
		}
		out = append(out, c)
	}
	return strings.Join(out, " ")
}

// TestEBSAttachAndEC2StopAgainstStandIn runs a whole builtin recovery with
// fence aws-ec2-stop and attach ebs through the aws-sdk-go-v2 EC2 client
// against the stand-in: the dead broker's instance is stopped, its volume
// attached here (Multi-Attach), waited for, read, and detached; the WAL is
// never written.
func TestEBSAttachAndEC2StopAgainstStandIn(t *testing.T) {
	s3cfg := s3test.StartFake(t)
	c := newTestCluster(t, "c1")
	dir := t.TempDir()
	sc := newScenario(t, c, dir, 3, 1000)
	before := fileHash(t, sc.walPath)
	si := &ec2StandIn{t: t, volume: "vol-0b1", instance: "i-coordinator1", stopTarget: "i-b1", device: "/dev/sdw",
		devPath: filepath.Join(dir, "dev-vol-0b1"), walPath: sc.walPath}
	srv := httptest.NewServer(si)
	defer srv.Close()

	cfg := testConfig()
	cfg.Fence, cfg.Attach = recovery.FenceAWSEC2Stop, recovery.AttachEBS
	cfg.FenceInstanceID = "i-{broker_id}"
	cfg.PathTemplate = filepath.Join(dir, "dev-{volume_id}")
	cfg.EBS = recovery.EBS{Region: "us-east-1", Endpoint: srv.URL, AccessKeyID: "AKIDTEST", SecretAccessKey: "secret",
		InstanceID: "i-coordinator1", Device: "/dev/sdw", PollInterval: 20 * time.Millisecond, AttachTimeout: 5 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	fencer, attacher, err := recovery.NewPlugins(context.Background(), cfg, nil, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, s3cfg)
	exe := newExecutor(c, "c1", cfg, store, fencer, attacher)
	j := c.declare(sc.broker, sc.epoch, "c1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exe.Run(ctx, j.GetJobId(), 1); err != nil {
		t.Fatal(err)
	}
	j, _ = c.s.Job(j.GetJobId())
	if j.GetJobState() != waldenv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %s: %s", j.GetJobState().Name(), j.GetError())
	}
	if got, want := si.callList(), "StopInstances DescribeVolumes+ AttachVolume DescribeVolumes+ DetachVolume"; got != want {
		t.Fatalf("EC2 calls %q, want %q", got, want)
	}
	details := map[string]string{}
	for _, cp := range j.GetCheckpoints() {
		details[cp.GetJobStep().Name()] = cp.GetDetail()
	}
	if !strings.Contains(details["fence"], "i-b1 stopping") || details["attach"] != "attached "+si.devPath || !strings.Contains(details["detach"], "vol-0b1 detaching") {
		t.Fatalf("checkpoints: %v", details)
	}
	checkCommitted(t, c, store, sc)
	if fileHash(t, sc.walPath) != before {
		t.Fatal("the WAL changed")
	}
	if _, err := os.Stat(si.devPath); !os.IsNotExist(err) {
		t.Fatalf("device still present after detach: %v", err)
	}
}

func fileHash(t *testing.T, p string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}
