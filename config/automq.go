package config

import (
	"errors"

	"walden/automq/failover"
)

// LoadAutoMQFailover reads the file `walden automq failover --config`
// takes: the keys of a coordinator's recovery.automq section, at the top
// level (cluster_id, controller, s3, block_size...), over
// failover.DefaultConfig(). set, when not nil, then applies the command's
// flags, which win over the file. The result is validated; every error is
// an *Error naming the file, the line and the key. With path empty only
// the defaults and set are used.
func LoadAutoMQFailover(path string, set func(*failover.Config)) (failover.Config, error) {
	cfg := failover.DefaultConfig()
	var src *source
	if path != "" {
		s, err := decodeFile(path, &cfg)
		if err != nil {
			return failover.Config{}, err
		}
		src = s
	}
	if set != nil {
		set(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		var fe *failover.ConfigError
		if errors.As(err, &fe) {
			return failover.Config{}, src.errAt(fe.Key, "%s", fe.Reason)
		}
		return failover.Config{}, err
	}
	return cfg, nil
}
