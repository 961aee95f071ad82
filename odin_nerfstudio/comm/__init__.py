"""Communication: the transports that exchange a step's sparse updates (in-process, torch.distributed) and the replica checks."""
