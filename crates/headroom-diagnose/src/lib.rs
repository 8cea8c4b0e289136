//! Failure classification rules (data) and the advice that goes with them.
