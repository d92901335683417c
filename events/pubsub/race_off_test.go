//go:build !race

package pubsub_test

// raceBuild: the tests run under the race detector.
const raceBuild = false
