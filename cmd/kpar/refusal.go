package main

import (
	"regexp"
	"strings"
)

// libraryRefusal is the library's refusal of the options the flags made
// (kpar.New's error), in the flags' words: "CommitInterval(0s) is not
// supported with ShareGroup" reads "--commit-interval 0s is not supported
// with --share-group". The rules live in the library alone (options.go,
// share.go, txn.go); the CLI only translates their names.
func libraryRefusal(err error) string {
	s := strings.TrimPrefix(err.Error(), "kpar: ")
	s = regexTopics.ReplaceAllString(s, "--topic-regex $1")
	s = optionCall.ReplaceAllStringFunc(s, func(m string) string {
		sub := optionCall.FindStringSubmatch(m)
		name, arg := sub[1], sub[2]
		fl, known := optionFlags[name]
		switch {
		case !known:
			return m
		case name == "Ordering" && orderingWords[arg] != "":
			return orderingWords[arg]
		case arg != "":
			return fl + " " + arg
		}
		return fl
	})
	return consumerWords.Replace(s)
}

// consumerWords name the process where the library names its Consumer.
var consumerWords = strings.NewReplacer("this Consumer", "this process", "a Consumer", "a process")

// regexTopics is how the library names a bad --topic-regex.
var regexTopics = regexp.MustCompile(`Topics\(("(?:[^"\\]|\\.)*")\) with TopicRegex`)

// optionCall matches an option's name in the library's errors, with its
// argument if it has one: CommitInterval(0s), ShareGroup, ByKey.
var optionCall = regexp.MustCompile(`\b([A-Z][A-Za-z]+)(?:\(([^()]*)\))?`)

// optionFlags are the library's option (and value) names and the flags
// that set them.
var optionFlags = map[string]string{
	"Group":            "--group",
	"ShareGroup":       "--share-group",
	"InstanceID":       "--instance-id",
	"GroupProtocol":    "--group-protocol",
	"CommitInterval":   "--commit-interval",
	"CommitBudget":     "--commit-budget",
	"Ordering":         "--ordering",
	"ByKey":            "--ordering key",
	"ByPartition":      "--ordering partition",
	"Unordered":        "--ordering unordered",
	"Topics":           "--topic",
	"TopicRegex":       "--topic-regex",
	"RetryTopics":      "--retry-topics",
	"ExactlyOnce":      "--exactly-once",
	"Outputs":          "--reply-topic alone",
	"DeadLetters":      "--dead-letters",
	"Concurrency":      "--concurrency",
	"MaxAttempts":      "--max-attempts",
	"RetryBackoff":     "--retry-backoff/--retry-backoff-max",
	"AttemptTimeout":   "--attempt-timeout",
	"ShutdownTimeout":  "--shutdown-timeout",
	"HangLimit":        "--hang-limit",
	"MaxBufferedBytes": "--max-buffered-bytes",
	"RateLimit":        "--rate-limit",
	"KeyRateLimit":     "--key-rate-limit",
	"Brokers":          "--brokers",
}

// orderingWords are Ordering(X)'s in the flags' words.
var orderingWords = map[string]string{
	"ByKey":       "--ordering key",
	"ByPartition": "--ordering partition",
	"Unordered":   "--ordering unordered",
}
