"""What a command computes: the synthesis methods and the batch pipelines of each release kind.

* :mod:`~beamsynth.pipelines.methods.registry`: the synthesis method registry (``Method``,
  ``register``, ``get_method``, ``IndependentMethod``; optional methods listed in
  ``_METHOD_MODULES``); :mod:`~beamsynth.pipelines.methods.wording`: ``Vocabulary``, how a
  method's build-time messages spell options for its caller (CLI flags or API keywords);
  :mod:`~beamsynth.pipelines.methods.options`: ``check_options`` / ``check_option_values``, a
  method's options (names, kinds, ``option_limits`` ranges) checked once for every caller;
* :mod:`~beamsynth.pipelines.methods.privbayes`, :mod:`~beamsynth.pipelines.methods.sbhg`,
  :mod:`~beamsynth.pipelines.methods.plausible`: ``--method privbayes|sbhg|plausible``, wiring the
  mechanisms of ``transforms/`` into the registry;
* :mod:`~beamsynth.pipelines.methods.synthesize`: the ``synthesize`` pipeline (``plan_synthesis``
  spends everything before data is read, ``build_synthesis``, ``run_synthesis``);
* :mod:`~beamsynth.pipelines.methods.histogram`: the CatHist ``histogram`` pipeline
  (``run_histogram``); :mod:`~beamsynth.pipelines.methods.prefixes`: the ``prefixes`` pipeline
  (``EncodeKeys``, ``run_prefixes``);
* :mod:`~beamsynth.pipelines.methods.progress`: stage lines and row counts on the terminal.

Uses :mod:`beamsynth.pipelines.io`; never imports ``releases``, ``cli`` or the API modules.
"""
