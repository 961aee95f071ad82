"""Method and dataparser specifications that nerfstudio discovers through entry points."""
