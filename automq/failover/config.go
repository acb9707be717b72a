package failover

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"walden/automq/controller"
	"walden/automq/object"
	"walden/objstore"
)

// Defaults of Config: AutoMQ 1.4.1's broker defaults where AutoMQ has the
// setting (s3.object.block.size, s3.stream.object.split.size, the failover's
// 512 MiB batches and 60 minutes of prepared-id lifetime).
const (
	DefaultBlockSize       = object.DefaultBlockSize
	DefaultStreamSplitSize = 8 << 20
	DefaultBatchSize       = 512 << 20
	MaxBatchSize           = 1 << 30
	DefaultPrepareTTL      = 60 * time.Minute
	DefaultUploadObjects   = 4
)

// Config is the `recovery.automq` section of a coordinator's configuration
// and the file `walden automq failover --config` reads: how to reach
// AutoMQ's controller and data bucket, and the object settings the cluster's
// brokers use.
type Config struct {
	// ClusterID is the AutoMQ cluster's id (the KRaft cluster.id). It names
	// the object key namespace "_kafka_<cluster_id>". Required.
	ClusterID string `yaml:"cluster_id"`
	// Controller says how to reach the active controller on its controller
	// listener.
	Controller ControllerConfig `yaml:"controller"`
	// S3 is AutoMQ's data bucket (s3.data.buckets). With bucket empty, a
	// coordinator uses its own s3 section; its prefix must then be empty,
	// since AutoMQ's keys start at the bucket's root.
	S3 objstore.Config `yaml:"s3"`
	// BucketIndex is the index of that bucket among the cluster's data
	// buckets, recorded in every object's attributes (AutoMQ's bucket id).
	// Default 0.
	BucketIndex int `yaml:"bucket_index"`
	// BlockSize is AutoMQ's s3.object.block.size: an object's data blocks
	// are cut once they hold this many payload bytes. Default 524288.
	BlockSize int `yaml:"block_size"`
	// StreamSplitSize is AutoMQ's s3.stream.object.split.size: a stream
	// with at least this many payload bytes in one batch gets a stream
	// object of its own. Default 8 MiB.
	StreamSplitSize int64 `yaml:"stream_split_size"`
	// BatchSize bounds the records of one upload and commit, counted as
	// AutoMQ's failover counts them (payload plus 144 bytes per record).
	// Default 512 MiB, AutoMQ's; at most 1 GiB. The records of a batch are
	// views of the mapped WAL (page cache, not heap) when the WAL can be
	// mapped, copies otherwise.
	BatchSize int64 `yaml:"batch_size"`
	// PrepareTTL is how long prepared object ids live at the controller
	// before they expire. Default 60m, AutoMQ's.
	PrepareTTL time.Duration `yaml:"prepare_ttl"`
	// UploadObjects is how many objects of a batch upload at the same time.
	// Default 4.
	UploadObjects int `yaml:"upload_objects"`
	// CloseStreamsWithGaps makes the failover do what AutoMQ's own does
	// with a stream whose WAL records do not start at the controller's end
	// offset: drop its records, reset the WAL and close the stream, so that
	// it becomes writable again while the missing records are lost. Off by
	// default: such a stream is left opened, the WAL is not reset and the
	// failover ends in an error that names the stream, for an operator to
	// decide.
	CloseStreamsWithGaps bool `yaml:"close_streams_with_gaps"`
}

// ControllerConfig is the controller listener of the AutoMQ cluster.
type ControllerConfig struct {
	// Voters are the controller quorum's host:port addresses on the
	// controller listener (controller.quorum.voters without the "id@").
	// Required.
	Voters []string `yaml:"voters"`
	// TLS is the client side of an SSL or SASL_SSL listener.
	TLS ControllerTLS `yaml:"tls"`
	// SASL is the login of a SASL_PLAINTEXT or SASL_SSL listener.
	SASL ControllerSASL `yaml:"sasl"`
	// DialTimeout bounds a connect to one voter. Default 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// RequestTimeout bounds one attempt at one voter. Default 10s.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// Attempts is how many rounds over the voters a call makes. Default 3.
	Attempts int `yaml:"attempts"`
}

// ControllerTLS is the client side of the controller listener's TLS.
type ControllerTLS struct {
	// Enabled turns TLS on (SSL or SASL_SSL).
	Enabled bool `yaml:"enabled"`
	// CAFile is the PEM bundle of the CA that signed the controllers'
	// certificates; empty means the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate, for listeners that
	// require one (ssl.client.auth=required).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name checked in the controllers'
	// certificates (default: each voter's host).
	ServerName string `yaml:"server_name"`
}

// ControllerSASL is a SASL login.
type ControllerSASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty for none.
	Mechanism string `yaml:"mechanism"`
	// Username is the SASL user name (required with a mechanism).
	Username string `yaml:"username"`
	// PasswordFile holds the password (its first line); the password is
	// never written in the configuration itself.
	PasswordFile string `yaml:"password_file"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Controller: ControllerConfig{
			DialTimeout:    controller.DefaultDialTimeout,
			RequestTimeout: controller.DefaultRequestTimeout,
			Attempts:       controller.DefaultAttempts,
		},
		S3:              objstore.DefaultConfig(),
		BlockSize:       DefaultBlockSize,
		StreamSplitSize: DefaultStreamSplitSize,
		BatchSize:       DefaultBatchSize,
		PrepareTTL:      DefaultPrepareTTL,
		UploadObjects:   DefaultUploadObjects,
	}
}

// ConfigError names the key (relative to the section) of an invalid value.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return "automq failover: " + e.Key + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Validate checks the section and names the first offending key, in the
// order of the keys: the cluster id, the controller's client settings, its
// TLS, its SASL login, the S3 bucket, the objects' layout and the batches.
// It reads no file; ControllerClientConfig reads the TLS and password files.
func (c Config) Validate() error {
	for _, check := range []func() error{
		c.validateClusterID, c.validateController, c.validateTLS, c.validateSASL,
		c.validateS3, c.validateLayout, c.validateBatches,
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

// validateClusterID checks that the cluster id is given and can name
// object keys.
func (c Config) validateClusterID() error {
	if strings.TrimSpace(c.ClusterID) == "" {
		return bad("cluster_id", "required: the AutoMQ cluster's id (cluster.id), which names its objects' keys")
	}
	if _, err := object.Key(c.ClusterID, 0); err != nil {
		return bad("cluster_id", "%q cannot name object keys: %v", c.ClusterID, err)
	}
	return nil
}

// validateController checks the controller client's settings as the client
// does, under the key controller.<key>; a password file stands for the
// password it will hold.
func (c Config) validateController() error {
	cc := c.controllerConfig()
	if c.Controller.SASL.PasswordFile != "" {
		cc.SASL.Password = "read from password_file" // read when the client is built
	}
	if err := cc.Validate(); err != nil {
		var ce *controller.ConfigError
		if errors.As(err, &ce) {
			return bad("controller."+ce.Key, "%s", ce.Reason)
		}
		return bad("controller", "%v", err)
	}
	return nil
}

// validateTLS checks that a client certificate comes with its key, and
// that no TLS file is set while TLS is off.
func (c Config) validateTLS() error {
	t := c.Controller.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		return bad("controller.tls.cert_file", "set both cert_file and key_file, or neither")
	}
	if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.ServerName != "") {
		return bad("controller.tls.enabled", "TLS files are set but TLS is not enabled")
	}
	return nil
}

// validateSASL checks the mechanism and that it comes with a username and
// a password file, and those with a mechanism.
func (c Config) validateSASL() error {
	s := c.Controller.SASL
	switch s.Mechanism {
	case "":
		if s.Username != "" || s.PasswordFile != "" {
			return bad("controller.sasl.mechanism", "a username or password file is set but no mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
	case controller.SASLPlain, controller.SASLScramSHA256, controller.SASLScramSHA512:
		if s.Username == "" {
			return bad("controller.sasl.username", "required by SASL %s", s.Mechanism)
		}
		if s.PasswordFile == "" {
			return bad("controller.sasl.password_file", "required by SASL %s", s.Mechanism)
		}
	default:
		return bad("controller.sasl.mechanism", "%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
	}
	return nil
}

// validateS3 checks the bucket's section as package objstore does, under
// the key s3.<key>, when a bucket is given; AutoMQ's keys start at the
// bucket's root, so it has no prefix.
func (c Config) validateS3() error {
	if c.S3.Bucket == "" {
		return nil
	}
	if err := c.S3.Validate(); err != nil {
		var se *objstore.ConfigError
		if errors.As(err, &se) {
			return bad("s3."+se.Key, "%s", se.Reason)
		}
		return bad("s3", "%v", err)
	}
	if c.S3.Prefix != "" {
		return bad("s3.prefix", "must be empty: AutoMQ's object keys start at the bucket's root")
	}
	return nil
}

// validateLayout checks the settings the objects are laid out with: the
// bucket index their attributes carry, the block and split sizes.
func (c Config) validateLayout() error {
	if c.BucketIndex < 0 || c.BucketIndex > object.MaxBucket {
		return bad("bucket_index", "%d: want 0..%d", c.BucketIndex, object.MaxBucket)
	}
	if c.BlockSize < 1 {
		return bad("block_size", "%d: must be positive (AutoMQ's default is %d)", c.BlockSize, DefaultBlockSize)
	}
	if c.StreamSplitSize < 1 {
		return bad("stream_split_size", "%d: must be positive (AutoMQ's default is %d)", c.StreamSplitSize, DefaultStreamSplitSize)
	}
	return nil
}

// validateBatches checks the bounds of a batch: its size, the lifetime of
// its prepared object ids and how many of its objects upload at once.
func (c Config) validateBatches() error {
	if c.BatchSize < 1<<20 || c.BatchSize > MaxBatchSize {
		return bad("batch_size", "%d: want 1 MiB .. 1 GiB (AutoMQ's is 512 MiB)", c.BatchSize)
	}
	if c.PrepareTTL < time.Minute || c.PrepareTTL > 24*time.Hour {
		return bad("prepare_ttl", "%s: want 1m .. 24h (AutoMQ's is 60m)", c.PrepareTTL)
	}
	if c.UploadObjects < 1 || c.UploadObjects > 64 {
		return bad("upload_objects", "%d: want 1..64", c.UploadObjects)
	}
	return nil
}

// controllerConfig is the client config without the files read.
func (c Config) controllerConfig() controller.Config {
	cc := controller.DefaultConfig()
	cc.Voters = c.Controller.Voters
	if c.Controller.DialTimeout != 0 {
		cc.DialTimeout = c.Controller.DialTimeout
	}
	if c.Controller.RequestTimeout != 0 {
		cc.RequestTimeout = c.Controller.RequestTimeout
	}
	if c.Controller.Attempts != 0 {
		cc.Attempts = c.Controller.Attempts
	}
	if c.Controller.TLS.Enabled {
		cc.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cc.SASL = controller.SASL{Mechanism: c.Controller.SASL.Mechanism, Username: c.Controller.SASL.Username}
	return cc
}

// ControllerClientConfig is the controller client's config, with the TLS
// files and the SASL password read.
func (c Config) ControllerClientConfig() (controller.Config, error) {
	cc := c.controllerConfig()
	t := c.Controller.TLS
	if t.Enabled {
		cc.TLS.ServerName = t.ServerName
		if t.CAFile != "" {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return cc, &ConfigError{Key: "controller.tls.ca_file", Reason: fileReason(err)}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return cc, &ConfigError{Key: "controller.tls.ca_file", Reason: fmt.Sprintf("%s holds no PEM certificate", t.CAFile)}
			}
			cc.TLS.RootCAs = pool
		}
		if t.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
			if err != nil {
				return cc, &ConfigError{Key: "controller.tls.cert_file", Reason: fmt.Sprintf("cannot load the client certificate: %v", err)}
			}
			cc.TLS.Certificates = []tls.Certificate{cert}
		}
	}
	if f := c.Controller.SASL.PasswordFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return cc, &ConfigError{Key: "controller.sasl.password_file", Reason: fileReason(err)}
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		pw = strings.TrimRight(pw, "\r")
		if pw == "" {
			return cc, &ConfigError{Key: "controller.sasl.password_file", Reason: fmt.Sprintf("%s holds no password on its first line", f)}
		}
		cc.SASL.Password = pw
	}
	return cc, nil
}

func fileReason(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Sprintf("cannot read %s: %v", pe.Path, pe.Err)
	}
	return err.Error()
}
