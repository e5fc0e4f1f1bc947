//! The paths between a job's nodes, measured before its ranks start (issue 64's
//! network check): which node measures which path in which round (`schedule`), and
//! which node is slow from the figures (`verdict`), and the whole at a scale no test
//! machine has (`simulate`). Pure: the agents measure, the
//! store carries the figures, this decides.

pub mod schedule;
pub mod simulate;
pub mod verdict;
