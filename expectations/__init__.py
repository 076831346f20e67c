"""Great Expectations suites for CommitLog segment integrity (:mod:`expectations.rules`) and their runner
(:mod:`expectations.runner`): results are rows of the ``quality_results`` Delta table and a JSON report."""
