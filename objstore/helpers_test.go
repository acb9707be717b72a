package objstore_test

import "github.com/aws/aws-sdk-go-v2/service/s3"

type s3CreateInput = s3.CreateMultipartUploadInput

func ptr[T any](v T) *T { return &v }
