package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"walden/config"
	"walden/mtls"
)

// clientTLS are the mutual-TLS flags of the commands that call the
// coordinators and the brokers (load, verify): the CA, and the client
// certificate and key (a reader's is enough).
type clientTLS struct{ cacert, cert, key string }

func (c *clientTLS) bind(f *pflag.FlagSet) {
	f.StringVar(&c.cacert, "cacert", "", "PEM file of the cluster's CA (with --cert and --key: mutual TLS)")
	f.StringVar(&c.cert, "cert", "", "PEM client certificate (walden certs issue --role reader is enough)")
	f.StringVar(&c.key, "key", "", "PEM private key of --cert")
}

// dialOptions are the gRPC dial options the flags ask for, of the
// coordinators and of the brokers' data API: mutual TLS (the servers'
// certificates must carry the coordinator and the broker role), or
// plaintext when none is given.
func (c *clientTLS) dialOptions() (coords, brokers []grpc.DialOption, err error) {
	t := config.TLS{CAFile: c.cacert, CertFile: c.cert, KeyFile: c.key}
	if t.Enabled() && (c.cacert == "" || c.cert == "" || c.key == "") {
		return nil, nil, errors.New("--cacert, --cert and --key go together")
	}
	creds, err := mtls.ClientCreds(t)
	if err != nil {
		return nil, nil, fmt.Errorf("--cacert/--cert/--key: %w", err)
	}
	bcreds, err := mtls.BrokerClientCreds(t)
	if err != nil {
		return nil, nil, fmt.Errorf("--cacert/--cert/--key: %w", err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(creds)}, []grpc.DialOption{grpc.WithTransportCredentials(bcreds)}, nil
}
