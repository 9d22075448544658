"""The GKE API emulator: REST surface, node-pool state and operations, validation rules, injected faults."""
