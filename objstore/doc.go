// Package objstore is walden's access to S3: uploads (parallel multipart
// through the aws-sdk-go-v2 transfer manager, or, for a body already in
// memory or a file, UploadAt's parts read where they lie without a copy;
// with CRC32C checksums that S3 verifies for every part), whole and ranged
// reads, listing, deletion, the
// cleanup of incomplete multipart uploads, and an embedded S3-compatible
// server (gofakes3 on a directory) for development and tests.
//
// It owns:
//
//   - Config (the `s3` configuration section) and its validation; empty
//     access keys fall back to the standard AWS credential chain;
//   - Client, the only type in walden that talks to S3;
//   - the fake server (NewFakeHandler, ServeFake) behind `walden s3` (tests start it with objstore/s3test).
//
// It must never:
//
//   - leave a partial object or an incomplete multipart upload behind after
//     a failed Upload or UploadAt that it could clean up (it aborts the multipart upload
//     with a fresh context even when the caller's context is cancelled);
//   - decide what an object means: keys and content come from the caller
//     (package objformat), commits from the catalog;
//   - listen on anything but the address it is given (ServeFake with no
//     address binds a port of 127.0.0.1 only).
package objstore
