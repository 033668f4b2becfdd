package kpar

// Protocol is a consumer group's rebalance protocol, Kafka's
// group.protocol. Its text form (String, MarshalText, UnmarshalText) is
// Kafka's name, "classic" or "consumer", so a flag.TextVar can set it.
type Protocol int

const (
	// ClassicProtocol is the group protocol of every Kafka: members join
	// (JoinGroup, SyncGroup) and balance partitions among themselves,
	// cooperative-sticky here. A rebalance waits for every member to
	// rejoin, a dead one until its session times out.
	ClassicProtocol Protocol = iota
	// ConsumerProtocol is the next-generation protocol of KIP-848 (Kafka
	// 4.0+): the broker assigns partitions, and members reconcile one by
	// one through their heartbeats, with no group-wide barrier. On a broker
	// without it, franz-go uses the classic protocol instead.
	ConsumerProtocol
)

var protocolNames = [...]string{ClassicProtocol: "classic", ConsumerProtocol: "consumer"}

// String returns "classic" or "consumer".
func (p Protocol) String() string { return enumString(protocolNames[:], p, "Protocol") }

// MarshalText implements encoding.TextMarshaler.
func (p Protocol) MarshalText() ([]byte, error) { return enumMarshal(protocolNames[:], p, "Protocol") }

// UnmarshalText implements encoding.TextUnmarshaler: it accepts "classic"
// or "consumer".
func (p *Protocol) UnmarshalText(b []byte) (err error) {
	*p, err = enumParse[Protocol](protocolNames[:], b, "group protocol")
	return err
}

// GroupProtocol sets the consumer group's rebalance protocol, overriding
// the default ClassicProtocol. Every member of a group should use the
// same; a kpar group refuses members of another ordering mode in either
// protocol (ErrOrderingMismatch). A share group has no rebalance
// protocol: ShareGroup refuses it.
func GroupProtocol(p Protocol) GroupOpt {
	return groupOpt(func(c *cfg) { c.protocol, c.explicit = p, c.explicit|setGroupProtocol })
}
