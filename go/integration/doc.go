// Package integration holds the Go side of tests/integration/test_go_client.py: tests that
// write through the fenced clients to a real API server and fence webhook. They run only when
// that pytest test builds them and sets FENCEDLEASE_GO_IT (go test ./... skips them).
package integration
