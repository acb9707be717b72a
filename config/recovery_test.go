package config

import (
	"strings"
	"testing"
	"time"
)

func TestRecoveryAndS3Sections(t *testing.T) {
	yaml := validYAML + `recovery:
  action: builtin
  attach: ebs
  fence: aws-ec2-stop
  fence_instance_id: "{broker_id}"
  job_lease: 4s
  upload_concurrency: 16
  part_size: 16777216
  object_size: 134217728
  exec: {command: /bin/true, args: [a, b], timeout: 1m}
  ebs: {region: eu-west-1, instance_id: i-1, device: /dev/sdx, poll_interval: 500ms}
s3:
  endpoint: http://127.0.0.1:9000
  bucket: walden
  path_style: true
  prefix: wal
`
	cfg, err := ParseServer("c1.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Recovery
	if r.Attach != "ebs" || r.JobLease != 4*time.Second || r.UploadConcurrency != 16 || r.ObjectSize != 128<<20 ||
		len(r.Exec.Args) != 2 || r.EBS.InstanceID != "i-1" || r.EBS.PollInterval != 500*time.Millisecond || r.EBS.AttachTimeout != 2*time.Minute {
		t.Fatalf("recovery %+v", r)
	}
	if cfg.S3.Bucket != "walden" || !cfg.S3.PathStyle || cfg.S3.Region != "us-east-1" || cfg.S3.Prefix != "wal" {
		t.Fatalf("s3 %+v", cfg.S3)
	}

	def, err := ParseServer("c1.yaml", []byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if def.Recovery.Action != "builtin" || def.Recovery.Attach != "local" || def.Recovery.JobLease != 10*time.Second || def.S3.Bucket != "" {
		t.Fatalf("defaults %+v %+v", def.Recovery, def.S3)
	}

	for _, tc := range []struct{ yaml, key string }{
		{"recovery: {fence: stonith}\n", "recovery.fence"},
		{"recovery: {attach: ebs}\n", "recovery.ebs.instance_id"},
		{"recovery: {action: exec}\n", "recovery.exec.command"},
		{"recovery: {job_lease: 10ms}\n", "recovery.job_lease"},
		{"recovery: {bogus: 1}\n", "bogus"},
		{"s3: {endpoint: ftp://x, bucket: b}\n", "s3.endpoint"},
		{"s3: {prefix: wal}\n", "s3.bucket"},
	} {
		_, err := ParseServer("c1.yaml", []byte(validYAML+tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Fatalf("%q: %v, want an error naming %s", tc.yaml, err, tc.key)
		}
	}
}
