// Package s3test starts S3 servers for tests: the embedded fake (gofakes3
// on a temporary directory, in process) and versitygw (a real S3 gateway,
// as a child process serving a temporary directory on 127.0.0.1). Both
// return an objstore.Config ready for objstore.New, and stop when the test
// ends.
//
// It must never listen beyond loopback, and never fail a test because
// versitygw is not installed: such tests skip with the install command.
package s3test
