package recovery

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	waldenv1 "walden/proto/walden/v1"
)

// JobJSON is the job as the exec plugins and the exec action read it on
// stdin (one JSON object). The contract is documented in docs/recovery.md.
type JobJSON struct {
	// Op is "fence", "attach", "detach" or "recover" (the exec action).
	Op       string `json:"op"`
	JobID    string `json:"job_id"`
	BrokerID string `json:"broker_id"`
	Token    uint64 `json:"token"`
	Attempt  uint32 `json:"attempt"`
	Assignee string `json:"assignee_id"`
	VolumeID string `json:"volume_id"`
	WALPath  string `json:"wal_path"`
	// AttachedPath is the path the attach step made readable ("" before).
	AttachedPath string `json:"attached_path,omitempty"`
	// Streams are the broker's opening streams (recover only).
	Streams []StreamJSON `json:"streams,omitempty"`
	// S3 is where the builtin action would upload (recover only).
	S3 *S3JSON `json:"s3,omitempty"`
	// AutoMQNodeID and AutoMQNodeEpoch are the broker's AutoMQ node as its
	// agent registered it (absent for other brokers).
	AutoMQNodeID    *int32 `json:"automq_node_id,omitempty"`
	AutoMQNodeEpoch *int64 `json:"automq_node_epoch,omitempty"`
}

// StreamJSON is one opening stream in JobJSON.
type StreamJSON struct {
	StreamID    uint64 `json:"stream_id"`
	Epoch       uint64 `json:"epoch"`
	StartOffset uint64 `json:"start_offset"`
	EndOffset   uint64 `json:"end_offset"`
}

// S3JSON says where objects go (credentials are never passed).
type S3JSON struct {
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
	Bucket   string `json:"bucket"`
	Prefix   string `json:"prefix,omitempty"`
}

// ProgressLine is one JSON line an exec plugin or action prints on stdout.
// Every field is optional; lines that are not JSON objects are logged and
// otherwise ignored.
type ProgressLine struct {
	Step          string `json:"step"`
	BytesUploaded uint64 `json:"bytes_uploaded"`
	BytesTotal    uint64 `json:"bytes_total"`
	StreamsClosed uint32 `json:"streams_closed"`
	StreamsTotal  uint32 `json:"streams_total"`
	Detail        string `json:"detail"`
	// Path is the attached WAL path (attach).
	Path string `json:"path"`
	// RecoveredWALOffset is the WAL offset up to which the recovery
	// uploaded (recover).
	RecoveredWALOffset *int64 `json:"recovered_wal_offset"`
}

func jobJSON(op string, j *waldenv1.Job) JobJSON {
	out := JobJSON{Op: op, JobID: j.GetJobId(), BrokerID: j.GetBrokerId(), Token: j.GetToken(), Attempt: j.GetAttempt(),
		Assignee: j.GetAssigneeId(), VolumeID: j.GetWal().GetVolumeId(), WALPath: j.GetWal().GetPath()}
	if n := j.GetAutomq(); n != nil {
		id, epoch := n.GetNodeId(), n.GetNodeEpoch()
		out.AutoMQNodeID, out.AutoMQNodeEpoch = &id, &epoch
	}
	return out
}

// expand fills the placeholders of a path or instance-id template.
func expand(tmpl string, j *waldenv1.Job) string {
	return strings.NewReplacer(
		"{broker_id}", j.GetBrokerId(),
		"{volume_id}", j.GetWal().GetVolumeId(),
		"{wal_path}", j.GetWal().GetPath(),
		"{token}", strconv.FormatUint(j.GetToken(), 10),
		"{job_id}", j.GetJobId(),
	).Replace(tmpl)
}

// runExec runs the exec command with in as JSON on stdin and calls line for
// each JSON line printed on stdout. A non-zero exit is an error carrying
// the end of stderr. The command runs in a process group of its own, killed
// whole when ctx ends and when the command exits; runExec returns only once
// the command is reaped.
func runExec(ctx context.Context, cfg Exec, in JobJSON, logger *slog.Logger, line func(ProgressLine)) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	payload, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("recovery: exec %s: encode job: %w", in.Op, err)
	}
	cmd := exec.CommandContext(ctx, cfg.Command, cfg.Args...)
	cmd.Stdin = bytes.NewReader(append(payload, '\n'))
	cmd.Env = append(os.Environ(),
		"WALDEN_OP="+in.Op, "WALDEN_JOB_ID="+in.JobID, "WALDEN_BROKER_ID="+in.BrokerID,
		"WALDEN_TOKEN="+strconv.FormatUint(in.Token, 10), "WALDEN_ATTEMPT="+strconv.FormatUint(uint64(in.Attempt), 10))
	cmd.WaitDelay = 2 * time.Second
	ownProcessGroup(cmd)
	var stderr tailBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("recovery: exec %s: %w", in.Op, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("recovery: exec %s: start %s: %w: %w", in.Op, cfg.Command, ErrPlugin, err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var pl ProgressLine
		if !strings.HasPrefix(text, "{") || json.Unmarshal([]byte(text), &pl) != nil {
			logger.Info("exec output", "op", in.Op, "job_id", in.JobID, "line", text)
			continue
		}
		if line != nil {
			line(pl)
		}
	}
	_, _ = io.Copy(io.Discard, out)
	err = cmd.Wait()
	// Whatever the plugin left behind in its group goes with it: nothing of
	// this run may outlive it (a next attempt must not overlap with it).
	killGroup(cmd)
	if err != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("recovery: exec %s: %s timed out after %s: %w", in.Op, cfg.Command, cfg.Timeout, ErrPlugin)
		}
		return fmt.Errorf("recovery: exec %s: %s: %v: %s: %w", in.Op, cfg.Command, err, stderr.String(), ErrPlugin)
	}
	return nil
}

// tailBuffer keeps the last 2 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }

// Fencer stops the dead broker's machine (STONITH). It must be idempotent:
// fencing a stopped machine succeeds.
type Fencer interface {
	// Fence returns a short detail for the checkpoint.
	Fence(ctx context.Context, j *waldenv1.Job) (string, error)
}

// Attacher makes the broker's WAL readable on this coordinator and
// releases it afterwards. Both must be idempotent.
type Attacher interface {
	// Attach returns the path of the WAL file or device.
	Attach(ctx context.Context, j *waldenv1.Job) (string, error)
	// Detach releases what Attach took; a short detail for the checkpoint.
	Detach(ctx context.Context, j *waldenv1.Job) (string, error)
}

type noFence struct{}

func (noFence) Fence(context.Context, *waldenv1.Job) (string, error) {
	return "no machine fencing (epoch fencing only)", nil
}

type execFence struct {
	cfg Exec
	log *slog.Logger
}

func (f execFence) Fence(ctx context.Context, j *waldenv1.Job) (string, error) {
	detail := "exec fence done"
	err := runExec(ctx, f.cfg, jobJSON("fence", j), f.log, func(pl ProgressLine) {
		if pl.Detail != "" {
			detail = pl.Detail
		}
	})
	return detail, err
}

// localAttach reads the WAL where the broker's agent said it is, or where
// the path template says.
type localAttach struct{ template string }

func (a localAttach) Attach(_ context.Context, j *waldenv1.Job) (string, error) {
	p := j.GetWal().GetPath()
	if a.template != "" {
		p = expand(a.template, j)
	}
	if p == "" {
		return "", fmt.Errorf("recovery: attach local: broker %q registered no wal.path and recovery.path_template is empty: %w", j.GetBrokerId(), ErrNoWAL)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("recovery: attach local: %w", err)
	}
	return p, nil
}

func (localAttach) Detach(context.Context, *waldenv1.Job) (string, error) {
	return "local: nothing to detach", nil
}

type execAttach struct {
	cfg Exec
	log *slog.Logger
}

func (a execAttach) Attach(ctx context.Context, j *waldenv1.Job) (string, error) {
	var path string
	err := runExec(ctx, a.cfg, jobJSON("attach", j), a.log, func(pl ProgressLine) {
		if pl.Path != "" {
			path = pl.Path
		}
	})
	if err != nil {
		return "", err
	}
	if path == "" {
		return "", fmt.Errorf("recovery: exec attach: %s printed no {\"path\": ...} line: %w", a.cfg.Command, ErrPlugin)
	}
	return path, nil
}

func (a execAttach) Detach(ctx context.Context, j *waldenv1.Job) (string, error) {
	detail := "exec detach done"
	err := runExec(ctx, a.cfg, jobJSON("detach", j), a.log, func(pl ProgressLine) {
		if pl.Detail != "" {
			detail = pl.Detail
		}
	})
	return detail, err
}

// EC2API is the part of the EC2 API the plugins use (*ec2.Client).
type EC2API interface {
	AttachVolume(ctx context.Context, in *ec2.AttachVolumeInput, optFns ...func(*ec2.Options)) (*ec2.AttachVolumeOutput, error)
	DetachVolume(ctx context.Context, in *ec2.DetachVolumeInput, optFns ...func(*ec2.Options)) (*ec2.DetachVolumeOutput, error)
	DescribeVolumes(ctx context.Context, in *ec2.DescribeVolumesInput, optFns ...func(*ec2.Options)) (*ec2.DescribeVolumesOutput, error)
	StopInstances(ctx context.Context, in *ec2.StopInstancesInput, optFns ...func(*ec2.Options)) (*ec2.StopInstancesOutput, error)
}

// NewEC2 returns an EC2 client for cfg: static credentials when both keys
// are set, otherwise the standard AWS chain; Endpoint overrides the URL.
func NewEC2(ctx context.Context, cfg EBS) (*ec2.Client, error) {
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(cfg.Region)}
	if cfg.AccessKeyID != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("recovery: load AWS config: %w", err)
	}
	return ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	}), nil
}

// ec2StopFence stops the broker's EC2 instance (force: the machine is
// presumed dead; its disk content is what we recover).
type ec2StopFence struct {
	api      EC2API
	template string
}

func (f ec2StopFence) Fence(ctx context.Context, j *waldenv1.Job) (string, error) {
	id := expand(f.template, j)
	out, err := f.api.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{id}, Force: aws.Bool(true)})
	if err != nil {
		return "", fmt.Errorf("recovery: fence aws-ec2-stop %s: %w: %w", id, ErrPlugin, err)
	}
	state := "stopping"
	for _, c := range out.StoppingInstances {
		if c.CurrentState != nil {
			state = string(c.CurrentState.Name)
		}
	}
	return fmt.Sprintf("instance %s %s", id, state), nil
}

// ebsAttach attaches the broker's WAL volume to this instance (EBS
// Multi-Attach: the dead broker's instance may still hold it), waits until
// DescribeVolumes says attached and the device exists, and detaches it at
// the end.
type ebsAttach struct {
	api      EC2API
	cfg      EBS
	template string
	// deviceExists reports whether the attached device is visible
	// (os.Stat; tests substitute).
	deviceExists func(string) bool
}

func (a ebsAttach) devicePath(j *waldenv1.Job) string {
	if a.template != "" {
		return expand(a.template, j)
	}
	return a.cfg.Device
}

func (a ebsAttach) attachment(ctx context.Context, vol string) (*ec2types.VolumeAttachment, error) {
	out, err := a.api.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{VolumeIds: []string{vol}})
	if err != nil {
		return nil, fmt.Errorf("recovery: attach ebs: describe %s: %w", vol, err)
	}
	for _, v := range out.Volumes {
		for _, at := range v.Attachments {
			if aws.ToString(at.InstanceId) == a.cfg.InstanceID {
				at := at
				return &at, nil
			}
		}
	}
	return nil, nil
}

func (a ebsAttach) Attach(ctx context.Context, j *waldenv1.Job) (string, error) {
	vol := j.GetWal().GetVolumeId()
	if vol == "" {
		return "", fmt.Errorf("recovery: attach ebs: broker %q registered no wal.volume_id: %w", j.GetBrokerId(), ErrNoWAL)
	}
	at, err := a.attachment(ctx, vol)
	if err != nil {
		return "", err
	}
	if at == nil {
		_, err := a.api.AttachVolume(ctx, &ec2.AttachVolumeInput{VolumeId: aws.String(vol), InstanceId: aws.String(a.cfg.InstanceID), Device: aws.String(a.cfg.Device)})
		if err != nil {
			return "", fmt.Errorf("recovery: attach ebs: attach %s to %s as %s: %w: %w", vol, a.cfg.InstanceID, a.cfg.Device, ErrPlugin, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, a.cfg.AttachTimeout)
	defer cancel()
	dev := a.devicePath(j)
	for {
		at, err := a.attachment(wctx, vol)
		if err == nil && at != nil && at.State == ec2types.VolumeAttachmentStateAttached && a.deviceExists(dev) {
			return dev, nil
		}
		select {
		case <-wctx.Done():
			return "", fmt.Errorf("recovery: attach ebs: %s not attached as %s within %s: %w", vol, dev, a.cfg.AttachTimeout, ErrPlugin)
		case <-time.After(a.cfg.PollInterval):
		}
	}
}

func (a ebsAttach) Detach(ctx context.Context, j *waldenv1.Job) (string, error) {
	vol := j.GetWal().GetVolumeId()
	at, err := a.attachment(ctx, vol)
	if err != nil {
		return "", err
	}
	if at == nil {
		return fmt.Sprintf("volume %s not attached here", vol), nil
	}
	if _, err := a.api.DetachVolume(ctx, &ec2.DetachVolumeInput{VolumeId: aws.String(vol), InstanceId: aws.String(a.cfg.InstanceID)}); err != nil {
		return "", fmt.Errorf("recovery: detach ebs %s: %w: %w", vol, ErrPlugin, err)
	}
	return fmt.Sprintf("volume %s detaching from %s", vol, a.cfg.InstanceID), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// NewPlugins builds the fence and attach plugins of cfg. ec2api may be nil
// (built from cfg.EBS when a plugin needs it).
func NewPlugins(ctx context.Context, cfg Config, ec2api EC2API, logger *slog.Logger) (Fencer, Attacher, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if ec2api == nil && (cfg.Attach == AttachEBS || cfg.Fence == FenceAWSEC2Stop) {
		c, err := NewEC2(ctx, cfg.EBS)
		if err != nil {
			return nil, nil, err
		}
		ec2api = c
	}
	var f Fencer = noFence{}
	switch cfg.Fence {
	case FenceExec:
		f = execFence{cfg: cfg.Exec, log: logger}
	case FenceAWSEC2Stop:
		f = ec2StopFence{api: ec2api, template: cfg.FenceInstanceID}
	}
	var a Attacher = localAttach{template: cfg.PathTemplate}
	switch cfg.Attach {
	case AttachEBS:
		a = ebsAttach{api: ec2api, cfg: cfg.EBS, template: cfg.PathTemplate, deviceExists: fileExists}
	case AttachExec:
		a = execAttach{cfg: cfg.Exec, log: logger}
	}
	return f, a, nil
}
