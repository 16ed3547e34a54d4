"""RDMA transport (pyverbs) for the agent-coordinator protocol."""
