//! namesrv (to be written)
