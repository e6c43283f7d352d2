-- The fair share of the fleet counts the runs running in every workspace
-- on each dispatch (quota::admit::fair_share).
CREATE INDEX runs_status ON runs (status);
