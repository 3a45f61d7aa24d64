"""The standalone RLVR trainer: the config schema, the step (collect, score, select, update),
checkpoints and the metrics log. Import submodules directly (``gmts.train.trainer``); this
package imports nothing heavy."""
