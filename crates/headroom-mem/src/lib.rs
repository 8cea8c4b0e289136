//! Device memory management: backends, pools, scoped buffers, aliases, workspaces, stats and traces.
