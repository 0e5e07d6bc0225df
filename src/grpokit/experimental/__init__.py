"""Trainers that are new and may still change, under the names TRL 1.16 gives them (`trl.experimental.*`)."""
