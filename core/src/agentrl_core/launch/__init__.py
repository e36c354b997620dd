"""Placement of the learner and engine pools (Ray placement groups; a local Ray on one machine)."""
