"""Studies of the serving path itself (gateway, gRPC, the host's threads), apart from the engine."""
