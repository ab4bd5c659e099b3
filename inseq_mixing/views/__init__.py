"""Views: the HTML reports of comparisons and evaluations, per-layer figures, terminal tables and Inseq's heatmap
colours. The analysis they show (comparisons, faithfulness, agreement, the evaluation protocols) lives in
:mod:`inseq_mixing.evaluation`."""
