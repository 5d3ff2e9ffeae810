"""Installing glm-grpo-ds where the GPUs are: the dependency ranges it declares and was tested with
(:mod:`.ranges`, read by ``glm-grpo env``), and the offline bundle of wheels for a node without a
package index (:mod:`.bundle`, ``glm-grpo wheelhouse``; docs/install.md)."""
