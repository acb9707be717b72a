package objstore

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
)

// Config is the `s3` configuration section.
type Config struct {
	// Endpoint is the S3 endpoint URL (e.g. http://127.0.0.1:9000); empty
	// means AWS S3 for Region.
	Endpoint string `yaml:"endpoint"`
	// Region is the signing region. Default us-east-1.
	Region string `yaml:"region"`
	// Bucket holds every object walden writes. Required.
	Bucket string `yaml:"bucket"`
	// PathStyle addresses buckets as http://endpoint/bucket/key instead of
	// virtual-hosted style. Needed by most local S3 servers (walden s3,
	// versitygw, MinIO).
	PathStyle bool `yaml:"path_style"`
	// AccessKeyID and SecretAccessKey are static credentials. Both empty
	// means the standard AWS credential chain (environment, shared files,
	// web identity, instance role).
	AccessKeyID     string `yaml:"access_key_id"`
	SecretAccessKey string `yaml:"secret_access_key"`
	// Prefix is prepended to every object key walden builds (see
	// objformat.Key). Optional.
	Prefix string `yaml:"prefix"`
}

// DefaultConfig returns the defaults: region us-east-1, everything else
// empty.
func DefaultConfig() Config {
	return Config{Region: "us-east-1"}
}

// ConfigError names the key (within the s3 section) of an invalid value.
type ConfigError struct {
	// Key is the key without the section, e.g. "region".
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return "objstore: s3." + e.Key + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Validate checks the config and names the offending key (*ConfigError).
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if c.Bucket == "" {
		return bad("bucket", "required")
	}
	if c.Region == "" {
		return bad("region", "required")
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("endpoint", "%q is not an http(s) URL", c.Endpoint)
		}
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return bad("access_key_id", "set both access_key_id and secret_access_key, or neither")
	}
	if strings.HasPrefix(c.Prefix, "/") {
		return bad("prefix", "%q must not start with '/'", c.Prefix)
	}
	return nil
}

// Options tune a Client.
type Options struct {
	// Concurrency is the number of parts uploaded in parallel. Default 8.
	Concurrency int
	// PartSize is the multipart part size in bytes; objects larger than it
	// are uploaded in parts. Default 8 MiB, minimum 5 MiB (the S3 limit).
	PartSize int64
	// Logger receives the client's logs. Default slog.Default().
	Logger *slog.Logger
	// HTTPClient, when set, sends the S3 requests (e.g. one that dials
	// from another network namespace). Default: the AWS SDK's.
	HTTPClient *http.Client
}

// Defaults and limits of Options.
const (
	DefaultConcurrency = 8
	DefaultPartSize    = 8 << 20
	MinPartSize        = 5 << 20
)

func (o Options) withDefaults() (Options, error) {
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.PartSize == 0 {
		o.PartSize = DefaultPartSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Concurrency < 1 || o.Concurrency > 256 {
		return o, fmt.Errorf("objstore: upload_concurrency %d: want 1..256: %w", o.Concurrency, ErrInvalidConfig)
	}
	if o.PartSize < MinPartSize {
		return o, fmt.Errorf("objstore: part_size %d: below the S3 minimum of %d: %w", o.PartSize, MinPartSize, ErrInvalidConfig)
	}
	return o, nil
}
