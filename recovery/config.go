package recovery

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"walden/automq/failover"
)

// Values of Config.Action, Config.Attach and Config.Fence.
const (
	ActionBuiltin = "builtin"
	ActionExec    = "exec"
	ActionAutoMQ  = "automq"

	AttachLocal = "local"
	AttachEBS   = "ebs"
	AttachExec  = "exec"

	FenceNone       = "none"
	FenceExec       = "exec"
	FenceAWSEC2Stop = "aws-ec2-stop"
)

// Config is the `recovery` configuration section.
type Config struct {
	// Action is "builtin" (walden reads the WAL, uploads, commits and
	// closes) or "exec" (the whole recovery is delegated to Exec.Command).
	// Default builtin.
	Action string `yaml:"action"`
	// Attach makes the WAL readable on this coordinator: "local" (the path
	// the broker's agent registered, or PathTemplate), "ebs" (EC2
	// AttachVolume with Multi-Attach) or "exec". Default local.
	Attach string `yaml:"attach"`
	// Fence stops the old machine before anything is read: "none", "exec"
	// or "aws-ec2-stop". Default none (the catalog's epoch fencing still
	// applies).
	Fence string `yaml:"fence"`
	// Exec is the command of the exec plugins and of the exec action.
	Exec Exec `yaml:"exec"`
	// JobLease is how long the leader waits without a renewal before it
	// reassigns a job; the assignee renews every JobLease/3. Default 10s.
	JobLease time.Duration `yaml:"job_lease"`
	// UploadConcurrency is the number of multipart parts uploaded in
	// parallel per object. Default 8.
	UploadConcurrency int `yaml:"upload_concurrency"`
	// PartSize is the multipart part size in bytes. Default 8 MiB (minimum
	// 5 MiB).
	PartSize int64 `yaml:"part_size"`
	// ObjectSize caps the size of one uploaded object in bytes. Default
	// 128 MiB (at most 512 MiB, at least PartSize). A recovery holds
	// ObjectSize × (UploadObjects + 2) bytes of objects at most (see
	// MemoryBound).
	ObjectSize int64 `yaml:"object_size"`
	// UploadObjects is the number of objects uploaded at the same time
	// (each with UploadConcurrency parts in flight; the next object is built
	// while one uploads). Default 1. Each one adds ObjectSize +
	// (UploadConcurrency + 2) × PartSize bytes to MemoryBound.
	UploadObjects int `yaml:"upload_objects"`
	// PathTemplate overrides the WAL path of attach local (and gives the
	// device path of attach ebs when the device is not found by name).
	// Placeholders: {broker_id}, {volume_id}, {wal_path}, {token}, {job_id}.
	PathTemplate string `yaml:"path_template"`
	// FenceInstanceID is the EC2 instance id that aws-ec2-stop stops, a
	// template with the same placeholders (e.g. "{broker_id}" when brokers
	// are named by instance id).
	FenceInstanceID string `yaml:"fence_instance_id"`
	// EBS configures the EC2 API used by attach ebs and fence aws-ec2-stop.
	EBS EBS `yaml:"ebs"`
	// RetryMin and RetryMax bound the capped exponential backoff between
	// retries of a failed step. Defaults 200ms and 30s.
	RetryMin time.Duration `yaml:"retry_min"`
	RetryMax time.Duration `yaml:"retry_max"`
	// AutoMQ configures the automq action: AutoMQ's controller, its data
	// bucket and its object settings (docs/automq.md). Read only when
	// action is automq.
	AutoMQ failover.Config `yaml:"automq"`
	// BlockedAfter is how long a step may fail without interruption before
	// the job stops retrying and enters blocked, with the step's error and
	// an alert (WaldenRecoveryJobBlocked), for an operator to retry or
	// resolve. Default 10m; at least retry_max.
	BlockedAfter time.Duration `yaml:"blocked_after"`
}

// Exec configures the exec plugins and action.
type Exec struct {
	// Command is the executable (absolute path or found in PATH).
	Command string `yaml:"command"`
	// Args are passed to it.
	Args []string `yaml:"args"`
	// Timeout bounds one run. Default 10m.
	Timeout time.Duration `yaml:"timeout"`
}

// EBS configures the EC2 API client and the attachment.
type EBS struct {
	// Region is the EC2 region. Default us-east-1.
	Region string `yaml:"region"`
	// Endpoint overrides the EC2 endpoint URL (tests, private endpoints).
	Endpoint string `yaml:"endpoint"`
	// AccessKeyID and SecretAccessKey are static credentials; both empty
	// means the standard AWS credential chain.
	AccessKeyID     string `yaml:"access_key_id"`
	SecretAccessKey string `yaml:"secret_access_key"`
	// InstanceID is this coordinator's instance, where volumes are attached.
	InstanceID string `yaml:"instance_id"`
	// Device is the device name asked for in AttachVolume. Default
	// /dev/sdw.
	Device string `yaml:"device"`
	// PollInterval is the DescribeVolumes polling period. Default 1s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// AttachTimeout bounds the wait for the attachment and the device.
	// Default 2m.
	AttachTimeout time.Duration `yaml:"attach_timeout"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Action:            ActionBuiltin,
		Attach:            AttachLocal,
		Fence:             FenceNone,
		Exec:              Exec{Timeout: 10 * time.Minute},
		JobLease:          10 * time.Second,
		UploadConcurrency: 8,
		PartSize:          8 << 20,
		ObjectSize:        128 << 20,
		UploadObjects:     1,
		EBS:               EBS{Region: "us-east-1", Device: "/dev/sdw", PollInterval: time.Second, AttachTimeout: 2 * time.Minute},
		RetryMin:          200 * time.Millisecond,
		RetryMax:          30 * time.Second,
		AutoMQ:            failover.DefaultConfig(),
		BlockedAfter:      10 * time.Minute,
	}
}

// MaxMemoryBound is the largest MemoryBound that Validate accepts.
const MaxMemoryBound = 4 << 30

// ObjectMemory is the most memory a builtin recovery holds in objects:
// the payloads of the object being built (one arena), the object being
// encoded and one object per uploader, each of at most ObjectSize bytes:
// ObjectSize × (UploadObjects + 2). It does not depend on the WAL's size.
func (c Config) ObjectMemory() int64 {
	return c.ObjectSize * int64(c.UploadObjects+2)
}

// TransferMemory is the most memory the S3 transfer manager holds in part
// buffers: per object uploading, UploadConcurrency + 1 parts in its pool
// and the first part read before the multipart upload starts:
// UploadObjects × (UploadConcurrency + 2) × PartSize.
func (c Config) TransferMemory() int64 {
	return int64(c.UploadObjects) * int64(c.UploadConcurrency+2) * c.PartSize
}

// MemoryBound is the most memory a builtin recovery uses for data,
// ObjectMemory + TransferMemory: 464 MiB with the defaults. The WAL is
// read through a read-only mapping, whose pages are the kernel's page cache
// (counted in the process's RSS while mapped, but clean and reclaimable),
// not the heap.
func (c Config) MemoryBound() int64 {
	return c.ObjectMemory() + c.TransferMemory()
}

// ConfigError names the key of an invalid value.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("recovery: recovery.%s: %s", e.Key, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Validate checks the config and names the first offending key: the
// plugins, the job lease, the transfer sizes and the memory they hold, the
// AWS settings, the retries, AutoMQ's settings, and blocked_after.
func (c Config) Validate() error {
	for _, check := range []func() error{
		c.validatePlugins, c.validateJobLease, c.validateTransfer, c.validateMemory, c.validateAWS,
		c.validateRetries, c.validateAutoMQ, c.validateBlockedAfter,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// bad is the ConfigError of key.
func bad(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// validatePlugins checks action, attach, fence and the exec plugin they may
// need.
func (c Config) validatePlugins() error {
	if !validAction(c.Action) {
		return bad("action", "%q is not builtin, exec or automq", c.Action)
	}
	switch c.Attach {
	case AttachLocal, AttachEBS, AttachExec:
	default:
		return bad("attach", "%q is not local, ebs or exec", c.Attach)
	}
	switch c.Fence {
	case FenceNone, FenceExec, FenceAWSEC2Stop:
	default:
		return bad("fence", "%q is not none, exec or aws-ec2-stop", c.Fence)
	}
	if (c.Action == ActionExec || c.Attach == AttachExec || c.Fence == FenceExec) && strings.TrimSpace(c.Exec.Command) == "" {
		return bad("exec.command", "required by the exec plugin or action")
	}
	if c.Exec.Timeout <= 0 {
		return bad("exec.timeout", "must be positive")
	}
	return nil
}

func (c Config) validateJobLease() error {
	if c.JobLease < 300*time.Millisecond {
		return bad("job_lease", "%s is below the minimum of 300ms", c.JobLease)
	}
	return nil
}

// validateTransfer checks the sizes and concurrency of the upload.
func (c Config) validateTransfer() error {
	if c.UploadConcurrency < 1 || c.UploadConcurrency > 256 {
		return bad("upload_concurrency", "%d: want 1..256", c.UploadConcurrency)
	}
	if c.PartSize < 5<<20 {
		return bad("part_size", "%d is below the S3 minimum of 5 MiB", c.PartSize)
	}
	if c.ObjectSize < c.PartSize || c.ObjectSize > 512<<20 {
		return bad("object_size", "%d: want part_size (%d) .. 512 MiB", c.ObjectSize, c.PartSize)
	}
	if c.UploadObjects < 1 || c.UploadObjects > 16 {
		return bad("upload_objects", "%d: want 1..16", c.UploadObjects)
	}
	return nil
}

// validateMemory checks MemoryBound against MaxMemoryBound, naming the key
// that weighs most.
func (c Config) validateMemory() error {
	m := c.MemoryBound()
	if m <= MaxMemoryBound {
		return nil
	}
	key := "upload_objects"
	if c.UploadObjects == 1 {
		key = "object_size"
		if c.TransferMemory() > c.ObjectMemory() {
			key = "part_size"
		}
	}
	return bad(key, "a recovery would hold up to %d MiB (object_size × (upload_objects + 2) + upload_objects × (upload_concurrency + 2) × part_size = %d × %d + %d × %d × %d), above the limit of %d MiB: lower object_size, upload_objects, upload_concurrency or part_size",
		m>>20, c.ObjectSize, c.UploadObjects+2, c.UploadObjects, c.UploadConcurrency+2, c.PartSize, MaxMemoryBound>>20)
}

// validateAWS checks the settings attach ebs and fence aws-ec2-stop need.
func (c Config) validateAWS() error {
	if c.Attach == AttachEBS && c.EBS.InstanceID == "" {
		return bad("ebs.instance_id", "required by attach ebs")
	}
	if c.Fence == FenceAWSEC2Stop && c.FenceInstanceID == "" {
		return bad("fence_instance_id", "required by fence aws-ec2-stop")
	}
	if c.Attach != AttachEBS && c.Fence != FenceAWSEC2Stop {
		return nil
	}
	switch {
	case c.EBS.Region == "":
		return bad("ebs.region", "required")
	case (c.EBS.AccessKeyID == "") != (c.EBS.SecretAccessKey == ""):
		return bad("ebs.access_key_id", "set both access_key_id and secret_access_key, or neither")
	case c.EBS.PollInterval <= 0:
		return bad("ebs.poll_interval", "must be positive")
	case c.EBS.AttachTimeout <= 0:
		return bad("ebs.attach_timeout", "must be positive")
	}
	return nil
}

func (c Config) validateRetries() error {
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		return bad("retry_min", "want 0 < retry_min <= retry_max (%s, %s)", c.RetryMin, c.RetryMax)
	}
	return nil
}

// validateAutoMQ checks AutoMQ's settings when the action is automq, under
// the key automq.<key>.
func (c Config) validateAutoMQ() error {
	if c.Action != ActionAutoMQ {
		return nil
	}
	err := c.AutoMQ.Validate()
	if err == nil {
		return nil
	}
	var fe *failover.ConfigError
	if errors.As(err, &fe) {
		return bad("automq."+fe.Key, "%s", fe.Reason)
	}
	return bad("automq", "%v", err)
}

func (c Config) validateBlockedAfter() error {
	if c.BlockedAfter < c.RetryMax {
		return bad("blocked_after", "%s is shorter than retry_max (%s): a failing step would block before its first retry; "+
			"set it to at least retry_max (default 10m)", c.BlockedAfter, c.RetryMax)
	}
	return nil
}
