//! Pure scheduling policy: peak prediction, admission, suspend and kill choices. No I/O, no clocks.
